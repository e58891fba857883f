//! The Android track: devices (the `adb`/emulator backend and the `sim` simulator) behind one
//! [`device::Device`] trait, the agents that drive them (LTGDroid and the baselines), the `sim`
//! and `emulator` executors, the oracle backbone that answers the agents' LLM requests from
//! the reports' ground truth (not a language model), and bug reports fetched from GitHub issues
//! ([`github`]).

pub mod adb;
pub mod agent;
pub mod baselines;
pub mod device;
pub mod emulator;
pub mod executor;
pub mod explore;
pub mod github;
pub mod llm_agents;
pub mod ltgdroid;
pub mod oracle;
pub mod sim;

pub(crate) use reprobench_domain::sync::lock;
