//! When a sandbox prepares an announced execution's tree ahead ([`crate::Sandbox::exec_ahead`]):
//! the mode a node is given, and the host's load it reads for `when-idle`.

/// When a sandbox stages the tree of an announced execution ahead (process: on a thread of
/// its own; docker: in the container booted ahead for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StageAheadMode {
    /// Never: every tree is staged on its execution's path (the baseline).
    Off,
    /// When a core is idle as an execution's command starts: staging ahead then takes no CPU
    /// from running tests (on as many busy slots as cores it would only move the work). On
    /// docker the container of the node's next task also boots only once a core is idle.
    #[default]
    WhenIdle,
    /// Always, whatever else runs.
    Always,
}

/// Whether a tree announced under `mode` is to be staged now: never when off, always when
/// always, and when a core is idle otherwise.
pub(crate) fn stage_now(mode: StageAheadMode) -> bool {
    match mode {
        StageAheadMode::Off => false,
        StageAheadMode::WhenIdle => a_core_is_idle(),
        StageAheadMode::Always => true,
    }
}

/// Whether fewer threads are runnable on this host than it has cores, besides the caller: the
/// kernel's count of runnable threads (`/proc/loadavg`'s fourth field, `R/T`), taken now.
fn a_core_is_idle() -> bool {
    // Read once: on Linux each call reads the cgroup's CPU quota files.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let Ok(text) = std::fs::read_to_string("/proc/loadavg") else {
        return false;
    };
    runnable_besides_caller(&text).is_some_and(|r| r < cores)
}

/// The runnable threads `/proc/loadavg` counts, less the reader itself.
fn runnable_besides_caller(loadavg: &str) -> Option<usize> {
    let field = loadavg.split_whitespace().nth(3)?;
    let (runnable, _) = field.split_once('/')?;
    Some(runnable.parse::<usize>().ok()?.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runnable_threads_are_read_from_loadavg_without_the_reader() {
        assert_eq!(
            runnable_besides_caller("1.24 1.17 1.95 3/412 11611\n"),
            Some(2)
        );
        assert_eq!(runnable_besides_caller("0.00 0.00 0.00 1/80 1\n"), Some(0));
        assert_eq!(runnable_besides_caller("garbage"), None);
    }
}
