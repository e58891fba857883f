//! Agents that produce an artifact for an instance, and the tools they use.

pub mod reproagent;
pub mod tools;
