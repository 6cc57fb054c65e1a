use std::time::Duration;

use justonce_core::{redact_url, ExponentialBackoff, Fingerprint, MessageId, MAX_MESSAGE_ID_BYTES};
use proptest::prelude::*;

proptest! {
    #[test]
    fn backoff_stays_within_its_bounds(
        base_ms in 1u64..5_000,
        max_ms in 1u64..600_000,
        jitter in 0.0f64..=1.0,
        seed in any::<u64>(),
        attempt in 1u32..200,
    ) {
        let base = Duration::from_millis(base_ms);
        let b = ExponentialBackoff::new(base, Duration::from_millis(max_ms)).with_jitter(jitter).with_seed(seed);
        let ceiling = b.ceiling(attempt);
        let d = b.delay(attempt);
        prop_assert!(d <= ceiling, "delay {d:?} above ceiling {ceiling:?}");
        prop_assert!(ceiling <= b.max(), "ceiling {ceiling:?} above max {:?}", b.max());
        prop_assert!(d >= ceiling.mul_f64(1.0 - jitter) - Duration::from_nanos(1), "delay {d:?} below the jitter floor");
        if attempt > 1 {
            prop_assert!(b.ceiling(attempt) >= b.ceiling(attempt - 1), "ceiling never shrinks");
        }
    }

    #[test]
    fn same_seed_same_delays(seed in any::<u64>()) {
        let mk = || ExponentialBackoff::new(Duration::from_millis(10), Duration::from_secs(5)).with_seed(seed);
        let (a, b) = (mk(), mk());
        for n in 1..10 {
            prop_assert_eq!(a.delay(n), b.delay(n));
        }
    }

    #[test]
    fn fingerprint_hex_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let fp = Fingerprint::of(&bytes);
        prop_assert_eq!(Fingerprint::from_hex(&fp.to_hex()), Some(fp));
    }

    #[test]
    fn redacted_urls_never_show_the_password(
        scheme in "(amqp|postgres|mysql|redis|nats)",
        user in "[a-z]{1,8}",
        password in "[A-Za-z0-9%]{4,16}",
        host in "[a-z]{1,8}(:[0-9]{2,5})?",
        path in "(/[a-z0-9%]{0,8})?",
    ) {
        let url = format!("{scheme}://{user}:{password}@{host}{path}");
        let red = redact_url(&url);
        prop_assert!(!red.contains(&format!(":{password}@")), "{red}");
        prop_assert_eq!(red, format!("{scheme}://{user}:***@{host}{path}"));
    }

    #[test]
    fn message_ids_are_non_blank_and_bounded(s in ".{0,300}") {
        let ok = !s.trim().is_empty() && s.len() <= MAX_MESSAGE_ID_BYTES;
        prop_assert_eq!(MessageId::new(s).is_ok(), ok);
    }
}

#[test]
fn fingerprints_differ_with_the_payload() {
    assert_ne!(Fingerprint::of(b"a"), Fingerprint::of(b"b"));
    assert_eq!(Fingerprint::from_hex("xyz"), None);
}
