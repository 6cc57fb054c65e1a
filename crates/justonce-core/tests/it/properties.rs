use std::time::Duration;

use justonce_core::{
    redact_url, ExponentialBackoff, Fingerprint, IdStrategy, Message, MessageId, StateMachine,
    MAX_MESSAGE_ID_BYTES,
};
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
    fn redacted_urls_never_show_a_secret_of_the_query(
        user in "[a-z]{1,8}",
        password in "[A-Za-z0-9%]{6,16}",
        key in "(password|PASSWORD|sslpassword|token|sasl[.]password)",
        before in "(sslmode=verify-full&)?",
        after in "(&sslrootcert=/ca.pem)?(#frag)?",
    ) {
        let url = format!("postgres://{user}:{password}@db/test?{before}{key}={password}{after}");
        let red = redact_url(&url);
        prop_assert!(!red.contains(&password), "{red}");
        prop_assert_eq!(red, format!("postgres://{user}:***@db/test?{before}{key}=***{after}"));
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

/// Stored fingerprints are compared as text: the digits must not change between versions.
#[test]
fn a_fingerprint_is_the_first_half_of_sha256_in_lowercase_hex() {
    // SHA-256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
    assert_eq!(
        Fingerprint::of(b"abc").to_hex(),
        "ba7816bf8f01cfea414140de5dae2223"
    );
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{json, Value};
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-z0-9 ]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Writes `v` with object keys in reverse order and extra whitespace.
fn scrambled(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<_> = m.keys().collect();
            keys.reverse();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| {
                    format!(
                        " {} :\n {} ",
                        Value::String((*k).clone()),
                        scrambled(&m[*k])
                    )
                })
                .collect();
            format!("{{ {} }}", parts.join(" , "))
        }
        Value::Array(a) => format!(
            "[ {} ]",
            a.iter().map(scrambled).collect::<Vec<_>>().join(" ,\t")
        ),
        other => other.to_string(),
    }
}

proptest! {
    #[test]
    fn content_hash_ignores_key_order_and_whitespace(v in json_value()) {
        let ids = IdStrategy::content_hash("t");
        let a = ids.derive(&Message::new(serde_json::to_vec(&v).unwrap())).unwrap();
        let b = ids.derive(&Message::new(scrambled(&v))).unwrap();
        prop_assert_eq!(a, b);
    }

    #[test]
    fn content_hash_changes_with_any_value(v in json_value(), w in json_value()) {
        prop_assume!(v != w);
        let ids = IdStrategy::content_hash("t");
        let a = ids.derive(&Message::new(serde_json::to_vec(&v).unwrap())).unwrap();
        let b = ids.derive(&Message::new(serde_json::to_vec(&w).unwrap())).unwrap();
        prop_assert_ne!(a, b);
    }

    #[test]
    fn content_hash_keys_are_namespaced(v in json_value()) {
        let payload = serde_json::to_vec(&v).unwrap();
        let a = IdStrategy::content_hash("orders").derive(&Message::new(payload.clone())).unwrap();
        let b = IdStrategy::content_hash("refunds").derive(&Message::new(payload)).unwrap();
        prop_assert_ne!(a, b);
    }
}

#[test]
fn ids_missing_from_the_payload_are_none_and_non_json_is_a_decode_error() {
    let f = IdStrategy::field("/order_id");
    assert_eq!(f.derive(&Message::new(r#"{"order_id":""}"#)).unwrap(), None);
    assert_eq!(f.derive(&Message::new(r#"{"other":1}"#)).unwrap(), None);
    assert_eq!(
        f.derive(&Message::new(r#"{"order_id":17}"#))
            .unwrap()
            .unwrap()
            .as_str(),
        "17"
    );
    let e = f.derive(&Message::new("not json")).unwrap_err();
    assert_eq!(e.kind(), justonce_core::ErrorKind::Decode);
    assert!(IdStrategy::field("order_id").validate().is_err());
    assert!(IdStrategy::content_hash("bad space").validate().is_err());
}

#[test]
fn state_machines_reject_cycles() {
    assert!(StateMachine::new([("A", "B"), ("B", "A")]).is_err());
    assert!(StateMachine::new([("A", "A")]).is_err());
    let m = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED")]).unwrap();
    let t = m.decide("NEW", "SHIPPED");
    assert_eq!(
        t.to_string(),
        "invalid transition NEW -> SHIPPED: SHIPPED may only be reached from PAID"
    );
}
