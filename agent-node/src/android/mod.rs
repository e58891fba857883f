//! The Android track on a node: devices (the `adb`/emulator backend and the `sim` simulator)
//! behind one [`device::Device`] trait.

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
