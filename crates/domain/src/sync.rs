//! Shared-state helpers.

/// Locks a mutex, carrying on with the data if a panicking attempt poisoned it: one attempt's
/// panic must not make every later attempt on the node panic too.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
