//! Metrics: define, increment, record, get.

use super::guest::*;
use crate::abi::*;
use crate::shared::lock;

/// The metric imports.
pub(super) fn add_to_linker(i: &mut Imports) -> wasmtime::Result<()> {
    i.func(
        "proxy_define_metric",
        |mut c: C, kind: i32, np: i32, nl: i32, ip: i32| -> i32 {
            let Some(kind) = MetricKind::from_raw(kind) else {
                return BAD_ARGUMENT;
            };
            let Some(name) = read_str(&mut c, np, nl) else {
                return INVALID_MEMORY;
            };
            let s = c.data_mut();
            let id = s.next_metric_id[kind as usize];
            s.next_metric_id[kind as usize] += 4;
            s.metric_names.insert(id, name.clone());
            lock(&s.shared)
                .metrics
                .entry(name)
                .or_insert_with(|| crate::shared::Metric {
                    kind,
                    value: 0,
                    samples: Vec::new(),
                });
            put_u32(&mut c, ip, id)
        },
    )?;
    i.func(
        "proxy_increment_metric",
        |c: C, id: i32, offset: i64| -> i32 {
            let s = c.data();
            let id = id as u32;
            let kind = id & 3;
            if kind == MetricKind::Histogram as u32 || kind == 3 {
                return BAD_ARGUMENT;
            }
            let Some(name) = s.metric_names.get(&id) else {
                return NOT_FOUND;
            };
            let mut sh = lock(&s.shared);
            let Some(m) = sh.metrics.get_mut(name) else {
                return NOT_FOUND;
            };
            if kind == MetricKind::Counter as u32 {
                if offset <= 0 {
                    return BAD_ARGUMENT;
                }
                m.value = m.value.wrapping_add(offset as u64);
            } else if offset > 0 {
                m.value = m.value.wrapping_add(offset as u64);
            } else {
                m.value = m.value.saturating_sub(offset.unsigned_abs());
            }
            OK
        },
    )?;
    i.func("proxy_record_metric", |c: C, id: i32, value: i64| -> i32 {
        let s = c.data();
        let id = id as u32;
        let Some(name) = s.metric_names.get(&id) else {
            return NOT_FOUND;
        };
        let mut sh = lock(&s.shared);
        let Some(m) = sh.metrics.get_mut(name) else {
            return NOT_FOUND;
        };
        let value = value as u64;
        match id & 3 {
            0 => m.value = m.value.wrapping_add(value),
            1 => m.value = value,
            2 => m.samples.push(value),
            _ => return NOT_FOUND,
        }
        OK
    })?;
    i.func("proxy_get_metric", |mut c: C, id: i32, ptr: i32| -> i32 {
        let id = id as u32;
        if id & 3 >= 2 {
            return BAD_ARGUMENT;
        }
        let value = {
            let s = c.data();
            let Some(name) = s.metric_names.get(&id) else {
                return NOT_FOUND;
            };
            match lock(&s.shared).metrics.get(name) {
                Some(m) => m.value,
                None => return NOT_FOUND,
            }
        };
        put_u64(&mut c, ptr, value)
    })?;
    Ok(())
}
