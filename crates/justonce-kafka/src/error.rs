//! Kafka errors as justonce [`Error`]s, classified by who is to blame: an outage or a
//! timeout is transient and never the message's fault.

use justonce_core::{Error, ErrorKind};
use rdkafka::error::{KafkaError, RDKafkaErrorCode as C};

/// The kind of a librdkafka error code.
pub(crate) fn kind_of(code: C) -> ErrorKind {
    match code {
        C::MessageSizeTooLarge | C::InvalidMessageSize | C::InvalidMessage => {
            ErrorKind::InvalidInput
        }
        C::MessageTimedOut | C::RequestTimedOut | C::OperationTimedOut => ErrorKind::Timeout,
        C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::Resolve
        | C::BrokerNotAvailable
        | C::NetworkException
        | C::LeaderNotAvailable
        | C::NotLeaderForPartition
        | C::CoordinatorNotAvailable
        | C::NotCoordinator
        | C::CoordinatorLoadInProgress => ErrorKind::Connect,
        C::UnknownTopicOrPartition
        | C::UnknownTopic
        | C::UnknownPartition
        | C::InvalidTopic
        | C::InvalidConfig
        | C::InvalidArgument
        | C::InvalidRequiredAcks => ErrorKind::Config,
        C::TopicAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::SaslAuthenticationFailed
        | C::Authentication => ErrorKind::Permission,
        C::QueueFull
        | C::NotEnoughReplicas
        | C::NotEnoughReplicasAfterAppend
        | C::KafkaStorageError => ErrorKind::Resource,
        C::Fatal | C::OutOfOrderSequenceNumber | C::InvalidProducerEpoch | C::ProducerFenced => {
            ErrorKind::Internal
        }
        _ => ErrorKind::Io,
    }
}

/// `e` with `context`, classified by its code.
pub(crate) fn kafka(context: impl std::fmt::Display, e: KafkaError) -> Error {
    let kind = e.rdkafka_error_code().map_or(ErrorKind::Io, kind_of);
    Error::with_source(kind, context.to_string(), e)
}

/// A librdkafka call that blocks, run off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> justonce_core::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::with_source(ErrorKind::Internal, what, e))
}
