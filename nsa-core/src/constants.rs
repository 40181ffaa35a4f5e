//! Shape-only constants (masks, index rows, the selection's overlap weights) built once per
//! shape, device and backend, and shared by every layer and step. Each is a handful of device
//! ops to build; rebuilt in every layer of every step they would multiply a training step's
//! ops, and a step's speed is bound by how many ops its host threads pass on
//! (docs/benchmarks.md, "Which host thread is the limit").

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use burn::tensor::backend::Backend;

/// Entries kept at most; the cache is emptied when it would grow past this (generation, which
/// grows `T` one token at a time, would otherwise keep one entry per length).
const MAX_ENTRIES: usize = 64;

type Key = (TypeId, String);

fn cache() -> &'static Mutex<HashMap<Key, Box<dyn Any + Send + Sync>>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Box<dyn Any + Send + Sync>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The constant `what` of shape parameters `dims` on `device`: `make()`'s value, built on first
/// use and cloned after. `make` must depend on nothing but `dims`, the device and the backend.
pub fn cached<B: Backend, T: Clone + Send + Sync + 'static>(
    what: &str,
    dims: &[usize],
    device: &B::Device,
    make: impl FnOnce() -> T,
) -> T {
    let key = (TypeId::of::<(B, T)>(), format!("{what}{dims:?}@{device:?}"));
    let lock = || cache().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(value) = lock().get(&key).and_then(|v| v.downcast_ref::<T>()) {
        return value.clone();
    }
    let value = make();
    let mut map = lock();
    if map.len() >= MAX_ENTRIES {
        map.clear();
    }
    map.insert(key, Box::new(value.clone()));
    value
}
