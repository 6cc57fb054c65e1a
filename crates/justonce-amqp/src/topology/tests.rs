//! Tests of `topology.rs` that need no server.

use super::*;

#[test]
fn rabbitmq_refusals_are_read_back() {
    let text =
        "declaring work queue orders: protocol error: AMQP soft error: PRECONDITION-FAILED: \
                PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'orders' in vhost \
                '/': received the value 'quorum' of type 'longstr' but current is none";
    let i = Inequivalent::parse(text).unwrap();
    assert_eq!(
        i,
        Inequivalent {
            arg: "x-queue-type".into(),
            wanted: "quorum".into(),
            current: "none".into()
        }
    );
    let opts = AmqpOptions::new("orders");
    let ps = parts(&opts);
    let said = i.explain(ps.last().unwrap(), &opts);
    assert!(
        said.contains("work queue orders exists as a classic queue"),
        "{said}"
    );
    assert!(said.contains("QueueType::Classic"), "{said}");

    let durable = Inequivalent::parse(
        "inequivalent arg 'durable' for queue 'x' in vhost '/': received 'true' but current is 'false'",
    )
    .unwrap();
    assert_eq!(
        (durable.wanted.as_str(), durable.current.as_str()),
        ("true", "false")
    );
    let ttl = Inequivalent::parse(
        "inequivalent arg 'x-message-ttl' for queue 'orders.retry.1000ms' in vhost '/': received the value '1000' of type 'signedint' but current is the value '2000' of type 'signedint'",
    )
    .unwrap();
    assert_eq!(
        (ttl.wanted.as_str(), ttl.current.as_str()),
        ("1000", "2000")
    );
}

#[test]
fn the_work_queue_is_declared_last_and_retry_tiers_follow_its_type() {
    let opts = AmqpOptions::new("orders");
    let ps = parts(&opts);
    assert!(matches!(
        ps.last(),
        Some(Part::Queue {
            role: "work queue",
            ..
        })
    ));
    let tier = ps
        .iter()
        .find_map(|p| match p {
            Part::Queue {
                role: "retry tier",
                args,
                ..
            } => Some(args),
            _ => None,
        })
        .unwrap();
    assert_eq!(tier.inner().get("x-queue-type"), Some(&s("quorum")));
    assert_eq!(tier.inner().get("x-dead-letter-exchange"), Some(&s("")));
    let classic = parts(&AmqpOptions::new("orders").queue_type(QueueType::Classic));
    assert!(classic.iter().all(
        |p| !matches!(p, Part::Queue { args, .. } if args.inner().contains_key("x-queue-type"))
    ));
}
