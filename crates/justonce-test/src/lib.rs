//! # justonce-test
//!
//! The test kit of justonce, for backend authors and for users testing their own handlers.
//!
//! - **Conformance suites**, one function per rule of a seam ([`dedup`], [`claims`],
//!   [`transport`]), and macros that stamp one `#[tokio::test]` per rule for a backend, so
//!   that a broken rule is one named failure:
//!
//!   ```no_run
//!   # mod m {
//!   justonce_test::dedup_store_tests!(|| async {
//!       Some(justonce_test::Backend::new(justonce_core::memory::MemoryStore::new()))
//!   });
//!   # }
//!   ```
//!
//! - **Services** ([`service_available`], [`unique_name`]): tests against a real server
//!   ask first, fail under `JUSTONCE_REQUIRE_SERVICES=1` and say `SKIPPED` otherwise, and
//!   keep to names of their own on a shared server.
//! - **Faults and effects** ([`faults`]): seeded in-process faults (a crash before the
//!   commit, after it, a lost ack, a duplicate publish) and a checker that counts lost and
//!   duplicated effects per id, so that you test your handler the way justonce tests itself.
//!
//! # Module map
//!
//! What each module holds, and the invariants this crate keeps (ARCHITECTURE.md, at the
//! repository's root, is the map of the whole).
//!
//! `dedup.rs`, `claims.rs`, `transport.rs`, `outbox.rs`: one `pub async fn` per rule, panicking
//! with the rule's sentence.
//! `lib.rs`: the macros (`dedup_store_tests!`, `dedup_claim_tests!`, `claim_store_tests!`,
//! `outbox_store_tests!`, `transport_tests!`) that stamp one `#[tokio::test]` per rule, and
//! `Backend`.
//! `services.rs`: `service_available`, `unique_name`.
//! `faults.rs`: `Faults` (a seeded `FaultHook`), `Effects` and `Verdict` (lost and duplicated
//! effects, from the business data).
//! `tls.rs`: `Pki`, a certificate authority of the test's own (rcgen) and what it signed, as
//! PEM files in a temporary directory.
//!
//! **Invariant: the kit does no I/O beyond the TCP probe of `service_available` and the files
//! of `tls::Pki`.**
//!
//! # Minimum supported Rust version
//!
//! 1.89.

#![allow(clippy::unwrap_used, clippy::panic)]

pub mod claims;
pub mod dedup;
pub mod faults;
pub mod outbox;
mod services;
pub mod tls;
pub mod transport;

pub use services::{debian13_root, service_available, unique_name, Backend};

#[doc(hidden)]
pub mod __private {
    pub use tokio;
}

/// Stamps one `#[tokio::test]` per rule of `$module` (its `RULES`), each calling
/// `$module::$rule(backend.value(), ns)` on a fresh backend from `$make`.
#[doc(hidden)]
#[macro_export]
macro_rules! __stamp {
    ($module:ident, $make:expr, [$($rule:ident),* $(,)?]) => {
        $(
            #[$crate::__private::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $rule() {
                let make = $make;
                let Some(backend) = make().await else { return };
                let ns = $crate::unique_name(stringify!($rule));
                $crate::$module::$rule(backend.value(), &ns).await;
                backend.finish().await;
            }
        )*
    };
}

/// One `#[tokio::test]` per rule of the [`DedupStore`](justonce_core::DedupStore) contract
/// ([`dedup`]). `$make` is a closure returning a future of `Option<Backend<S>>`: a fresh
/// store, or `None` when its service is unavailable (after [`service_available`] said so).
/// Call it inside a module of its own per backend.
#[macro_export]
macro_rules! dedup_store_tests {
    ($make:expr) => {
        $crate::dedup_claim_tests!($make);
        $crate::__stamp!(dedup, $make, [purge_removes_old_records_in_batches]);
    };
}

/// As [`dedup_store_tests!`], without the purge rule: for a store that purges in whole
/// days (a partitioned table) and tests its purge on its own.
#[macro_export]
macro_rules! dedup_claim_tests {
    ($make:expr) => {
        $crate::__stamp!(
            dedup,
            $make,
            [
                fresh_then_duplicate_then_conflict,
                keys_are_scoped_by_consumer,
                rollback_forgets_a_claim,
                savepoints_keep_or_discard_their_claims,
                concurrent_claims_of_one_key_one_wins,
                concurrent_batches_of_the_same_keys_one_wins,
                claim_many_answers_as_claims_one_by_one,
                a_rolled_back_claim_many_leaves_nothing,
                begin_with_claims_answers_one_key,
                begin_with_claims_answers_a_batch,
                begin_with_claims_records_each_fingerprint_and_odd_ids,
                begin_with_claims_hashes_the_payloads,
            ]
        );
    };
}

/// One `#[tokio::test]` per rule of the [`ClaimStore`](justonce_core::ClaimStore) contract
/// ([`claims`]); `$make` returns a future of `Option<Backend<Arc<C>>>`, with leases of
/// [`claims::LEASE`] in mind (the rules wait for them to run out).
#[macro_export]
macro_rules! claim_store_tests {
    ($make:expr) => {
        $crate::__stamp!(
            claims,
            $make,
            [
                a_held_claim_is_in_progress,
                a_release_lets_a_retry_in_with_a_higher_token,
                a_completed_claim_returns_its_result,
                an_expired_holder_is_taken_over_and_fenced,
                claims_are_scoped_by_consumer,
                concurrent_acquires_one_holder,
                batch_forms_answer_as_single_ones,
                purge_removes_old_completed_claims_only,
            ]
        );
    };
}

/// One `#[tokio::test]` per rule of the [`OutboxStore`](justonce_core::OutboxStore)
/// contract ([`outbox`]); `$make` returns a future of
/// `Option<Backend<outbox::Outboxed<S, O>>>`: a business store and an empty outbox of its own.
#[macro_export]
macro_rules! outbox_store_tests {
    ($make:expr) => {
        $crate::__stamp!(
            outbox,
            $make,
            [
                nothing_leaves_before_the_commit_and_a_rollback_leaves_nothing,
                a_leased_row_is_taken_again_only_after_its_lease,
                rows_of_a_key_go_out_in_order_one_relay_at_a_time,
                a_sent_row_is_gone_and_marking_it_again_is_harmless,
                a_failed_row_waits_blocking_its_key_then_dies_visibly,
                bad_outgoing_messages_are_refused_inside_the_transaction,
                dead_rows_are_shown_revived_and_discarded,
            ]
        );
    };
}

/// One `#[tokio::test]` per rule of the transport contract ([`transport`]):
/// [`Source`](justonce_core::Source), [`Publisher`](justonce_core::Publisher) and
/// [`Inspect`](justonce_core::Inspect). `$make` returns a future of
/// `Option<Backend<transport::Queue<Q>>>`: a fresh, empty queue and its lease.
#[macro_export]
macro_rules! transport_tests {
    ($make:expr) => {
        $crate::__stamp!(
            transport,
            $make,
            [
                publish_then_receive_in_order,
                leased_deliveries_are_not_delivered_twice,
                an_ack_settles_for_good,
                an_expired_lease_or_a_dropped_connection_redelivers,
                a_stale_receipt_acks_nothing,
                a_nack_with_a_delay_is_not_delivered_before_it,
                a_release_counts_no_attempt,
                a_dead_letter_keeps_payload_id_headers_and_reason,
                a_replay_returns_a_dead_letter_under_its_own_id,
                a_bad_replay_moves_nothing_and_a_purge_deletes_what_it_names,
                receive_waits_as_long_as_asked,
                bad_messages_are_still_delivered,
            ]
        );
    };
}
