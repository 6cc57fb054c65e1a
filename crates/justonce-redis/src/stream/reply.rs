//! Redis replies read as text and bytes.

use std::collections::HashMap;

use redis::Value;

use super::{Entry, Fields};

/// A flat `[name, value, …]` array (or a RESP3 map) as text.
pub(super) fn flat_map(v: &Value) -> HashMap<String, String> {
    let mut m = HashMap::new();
    match v {
        Value::Array(items) => {
            for pair in items.chunks(2) {
                if let (Some(k), Some(v)) =
                    (pair.first().and_then(text), pair.get(1).and_then(text))
                {
                    m.insert(k, v);
                }
            }
        }
        Value::Map(items) => {
            for (k, v) in items {
                if let (Some(k), Some(v)) = (text(k), text(v)) {
                    m.insert(k, v);
                }
            }
        }
        _ => {}
    }
    m
}

/// An `XRANGE` reply as (entry id, fields).
pub(super) fn entries(reply: Value) -> Vec<Entry> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|e| {
            let Value::Array(e) = e else { return None };
            Some((
                e.first().and_then(text)?,
                e.get(1).map(pairs).unwrap_or_default(),
            ))
        })
        .collect()
}

/// `[field, value, …]` as pairs of bytes.
pub(super) fn pairs(v: &Value) -> Fields {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .chunks(2)
        .filter_map(|p| Some((bytes(p.first()?)?, bytes(p.get(1)?)?)))
        .collect()
}

pub(super) fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

pub(super) fn text(v: &Value) -> Option<String> {
    bytes(v).map(|b| String::from_utf8_lossy(&b).into_owned())
}
