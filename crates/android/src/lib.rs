//! The Android track: devices (the `adb`/emulator backend and the `sim` simulator) behind one
//! [`device::Device`] trait, the agents that drive them (LTGDroid and the baselines), and the
//! `sim` and `emulator` executors.

pub mod adb;
pub mod agent;
pub mod baselines;
pub mod device;
pub mod emulator;
pub mod executor;
pub mod explore;
pub mod llm_agents;
pub mod ltgdroid;
pub mod sim;

/// Locks a mutex, carrying on with the data if a panicking attempt poisoned it: one attempt's
/// panic must not make every later attempt on the node panic too.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
