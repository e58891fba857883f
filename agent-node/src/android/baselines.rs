//! TEMPORARY placeholder until the baselines branch is merged; not committed.
use super::agent::{AgentError, AndroidRun, Meter};
use super::device::Device;
use crate::agents::Llm;
use reprobench_proto::android::AndroidReport;
/// placeholder
pub async fn rebl<L: Llm>(
    _l: &mut L,
    _d: &dyn Device,
    _p: &str,
    _r: &AndroidReport,
    _v: bool,
    _m: &Meter,
) -> Result<AndroidRun, AgentError> {
    Err(AgentError::Llm("placeholder".into()))
}
/// placeholder
pub async fn adbgpt<L: Llm>(
    _l: &mut L,
    _d: &dyn Device,
    _p: &str,
    _r: &AndroidReport,
    _m: &Meter,
) -> Result<AndroidRun, AgentError> {
    Err(AgentError::Llm("placeholder".into()))
}
