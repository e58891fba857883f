//! The `emulator` executor: runs an android task's agent on a real Android emulator of the
//! node's pool, driven through the `adb` backend, and grades it.
//!
//! Per attempt: the report's row and APK are looked up on the node, a pool slot is taken (and
//! its emulator launched and booted when it is not running), the APK is installed and its
//! package found from `pm list packages -3` before and after, the app's data is cleared and the
//! agent runs. Crash reports are graded by replaying the offered trace from a cleared app start
//! on the same emulator and asking the crash oracle; non-crash reports cannot be checked
//! automatically, so an agent's claim becomes `needs_review` for `reprobench review`.
//!
//! This module was written against the adb command line and the emulator's flags and tested
//! with recorded adb outputs only: it has not been exercised against a running emulator.

use super::adb::adb::{AdbDevice, RunFuture, Runner};
use super::adb::console::ConsoleAddress;
use super::adb::pool::{
    BootStatus, Decision, Emulator, HealthEvent, Pool, PoolConfig, PoolError, Slot, wait_for_boot,
};
use super::agent::AgentError;
use super::device::{Action, Crash, Device, DeviceError};
use super::explore::monkey;
use super::llm_agents;
use reprobench_domain::android::{AndroidInstance, AndroidPayload, BugType, load_android_dataset};
use reprobench_domain::outcome::{FailureClass, Outcome};
use reprobench_domain::registry::ExecutorKind;
use reprobench_domain::registry::{self, AgentKind, Track};
use reprobench_domain::time::now_ms;
use reprobench_executor::{
    AttemptContext, AttemptEnd, AttemptSpec, BoxFuture, Executor, error_end as error,
};
use reprobench_gateway::{Gateway, Usage};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a node runs its emulators and where it finds apps and reports.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EmulatorSettings {
    /// The `emulator` binary.
    pub emulator: PathBuf,
    /// The `adb` binary.
    pub adb: PathBuf,
    /// The AVD every emulator runs.
    pub avd: String,
    /// How many emulators run at most (the pool's capacity).
    pub emulators: u16,
    /// Directory of the APK files the reports name (`apk_name`).
    pub apks: PathBuf,
    /// Directory of the android datasets (manifests, rows and fetched reports).
    pub datasets: PathBuf,
    /// Where each attempt's trace goes.
    pub artifacts: PathBuf,
    /// How long an emulator may take to boot.
    pub boot_timeout: Duration,
}

impl EmulatorSettings {
    /// Settings for `avd` with the binaries on `PATH`, one emulator and a 180 s boot limit.
    pub fn new(
        avd: &str,
        apks: PathBuf,
        datasets: PathBuf,
        artifacts: PathBuf,
    ) -> EmulatorSettings {
        EmulatorSettings {
            emulator: PathBuf::from("emulator"),
            adb: PathBuf::from("adb"),
            avd: avd.to_string(),
            emulators: 1,
            apks,
            datasets,
            artifacts,
            boot_timeout: Duration::from_secs(180),
        }
    }

    /// The pool configuration these settings describe.
    pub fn pool_config(&self) -> PoolConfig {
        let mut cfg = PoolConfig::new(&self.emulator, &self.avd);
        cfg.size = self.emulators.max(1);
        cfg.boot_timeout = self.boot_timeout;
        cfg
    }
}

/// Shares one runner between the pool's boot probes and every device.
#[derive(Clone)]
struct SharedRunner(Arc<dyn Runner>);

impl Runner for SharedRunner {
    fn run<'a>(
        &'a self,
        program: &'a Path,
        args: &'a [String],
        timeout: Duration,
    ) -> RunFuture<'a> {
        self.0.run(program, args, timeout)
    }
}

/// The executor's shared state.
struct Inner {
    settings: EmulatorSettings,
    pool: Mutex<Pool>,
    processes: Mutex<HashMap<u16, Emulator>>,
    runner: Arc<dyn Runner>,
    gateway: Option<Gateway>,
    /// APK file name → package, learnt from earlier installs (a reinstall lists nothing new).
    packages: Mutex<HashMap<String, String>>,
}

impl Inner {
    /// Records `event` for `slot`; a restarted or retired slot loses its emulator process.
    fn event(&self, slot: &Slot, event: HealthEvent) -> Decision {
        let d = crate::lock(&self.pool).on(slot, event);
        if d != Decision::Keep {
            // Dropping the process kills it (kill_on_drop).
            self.processes
                .lock()
                .expect("processes lock")
                .remove(&slot.index);
        }
        d
    }
}

/// Gives the slot back when the attempt ends, however it ends (also when cancelled).
struct SlotGuard {
    inner: Arc<Inner>,
    slot: Slot,
    /// The pool freed the slot itself (restart or retire): it may already serve someone else.
    freed: bool,
}

impl SlotGuard {
    /// Records `event` for the held slot.
    fn event(&mut self, event: HealthEvent) -> Decision {
        let d = self.inner.event(&self.slot, event);
        if d != Decision::Keep {
            self.freed = true;
        }
        d
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if !self.freed
            && let Ok(mut pool) = self.inner.pool.lock()
        {
            pool.release(&self.slot);
        }
    }
}

/// Why the emulator executor could not be set up, or an install's package not be determined.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    /// The settings name no AVD.
    #[error("the emulator executor needs an AVD: pass --avd NAME")]
    MissingAvd,
    /// The emulator pool could not be set up.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// One install added several packages.
    #[error(
        "the install added several packages ({}); install one app per APK",
        .packages.join(", ")
    )]
    SeveralPackages { packages: Vec<String> },
}

/// Runs android tasks on the node's emulators.
pub struct EmulatorExecutor {
    inner: Arc<Inner>,
}

impl EmulatorExecutor {
    /// An executor over a pool of `settings.emulators` emulators, running real adb processes.
    pub fn new(settings: EmulatorSettings) -> Result<EmulatorExecutor, EmulatorError> {
        EmulatorExecutor::with_runner(settings, Arc::new(super::adb::adb::ProcessRunner))
    }

    /// The same with every adb call going through `runner`.
    pub fn with_runner(
        settings: EmulatorSettings,
        runner: Arc<dyn Runner>,
    ) -> Result<EmulatorExecutor, EmulatorError> {
        if settings.avd.trim().is_empty() {
            return Err(EmulatorError::MissingAvd);
        }
        let pool = Pool::new(settings.pool_config())?;
        Ok(EmulatorExecutor {
            inner: Arc::new(Inner {
                settings,
                pool: Mutex::new(pool),
                processes: Mutex::new(HashMap::new()),
                runner,
                gateway: None,
                packages: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The same executor with LLM agents enabled through `gateway`.
    pub fn with_gateway(self, gateway: Gateway) -> EmulatorExecutor {
        let inner = Arc::try_unwrap(self.inner)
            .unwrap_or_else(|_| panic!("with_gateway is called before the executor is shared"));
        EmulatorExecutor {
            inner: Arc::new(Inner {
                gateway: Some(gateway),
                ..inner
            }),
        }
    }

    /// Records a health event for the slot at `index` (e.g. `Booted` for an emulator started
    /// outside the node) and says what the pool decided.
    pub fn record(&self, index: u16, event: HealthEvent) -> Decision {
        let slot = self
            .inner
            .pool
            .lock()
            .expect("pool lock")
            .slots()
            .find(|s| s.index == index)
            .copied();
        match slot {
            Some(s) => self.inner.event(&s, event),
            None => Decision::Keep,
        }
    }

    /// Slots currently in use.
    pub fn busy(&self) -> usize {
        crate::lock(&self.inner.pool).busy()
    }
}

/// The third-party packages `pm list packages -3` prints (`package:NAME` lines).
pub fn parse_packages(out: &str) -> BTreeSet<String> {
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("package:"))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The package an install added, from the package lists before and after it: `Ok(None)`
/// when nothing new appeared (a reinstall), an error when several did.
pub fn installed_package(before: &str, after: &str) -> Result<Option<String>, EmulatorError> {
    let before = parse_packages(before);
    let new: Vec<String> = parse_packages(after)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    match new.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many => Err(EmulatorError::SeveralPackages {
            packages: many.to_vec(),
        }),
    }
}

/// What an agent said about its trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The agent has no claim to make (the monkey): its replay alone is graded.
    NotAsked,
    /// The agent claimed a reproduction within its budget.
    Made,
    /// The agent made no claim, or made it past its budget (a failure, as the papers count it).
    NotMade,
}

/// How an attempt is graded: success and verdict from the bug type, the crash the replay hit
/// (which must be one the report names, when it names any), and the agent's claim.
pub fn grade(
    bug_type: BugType,
    replay_crash: Option<&Crash>,
    reported: &BTreeSet<String>,
    claim: Claim,
) -> (bool, &'static str) {
    match bug_type {
        _ if claim == Claim::NotMade => (false, "not_reproduced"),
        BugType::Crash if replay_crash.is_some_and(|c| c.is_reported(reported)) => {
            (true, "reproduced")
        }
        BugType::Crash => (false, "not_reproduced"),
        // Nothing on a real device checks a wrong behaviour: a person reviews the claim.
        BugType::NonCrash if claim == Claim::Made => (true, "needs_review"),
        BugType::NonCrash => (false, "not_reproduced"),
    }
}

/// Replays `trace` from a cleared app start and returns the app's crash, if any. An action
/// the device rejects (its widget is gone) ends the replay.
pub async fn replay_for_crash(
    dev: &dyn Device,
    package: &str,
    trace: &[Action],
) -> Result<Option<Crash>, DeviceError> {
    dev.clear(package).await?;
    dev.launch(package).await?;
    for a in trace {
        match dev.act(a).await {
            Ok(()) => {}
            Err(DeviceError::Rejected(_)) => break,
            Err(e) => return Err(e),
        }
        if let Some(c) = dev.crash().await? {
            return Ok(Some(c));
        }
    }
    dev.crash().await
}

/// Why an attempt stopped early.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// Retried (infra) or final (bad input).
    pub class: FailureClass,
    /// Error class in the outcome.
    pub what: &'static str,
    /// What happened and what to do.
    pub message: String,
    /// Whether the device's transport failed (the pool hears of it).
    pub device_down: bool,
    /// LLM usage metered before the failure (charged to the outcome all the same).
    pub usage: Box<Usage>,
}

impl Failure {
    fn new(class: FailureClass, what: &'static str, message: String) -> Failure {
        Failure {
            class,
            what,
            message,
            device_down: false,
            usage: Box::default(),
        }
    }
}

impl From<DeviceError> for Failure {
    fn from(e: DeviceError) -> Failure {
        Failure {
            class: FailureClass::Infra,
            what: "device",
            device_down: matches!(e, DeviceError::Unavailable(_)),
            message: e.to_string(),
            usage: Box::default(),
        }
    }
}

/// What an attempt on a device produced.
#[derive(Debug, Clone, Default)]
pub struct Graded {
    /// Success as graded.
    pub success: bool,
    /// `reproduced`, `needs_review` or `not_reproduced`.
    pub verdict: String,
    /// Actions the agent executed.
    pub actions: usize,
    /// The offered trace.
    pub trace: Vec<Action>,
    /// Metered LLM usage (LLM agents).
    pub usage: Usage,
    /// What goes into `trace.json` and the outcome's details.
    pub details: serde_json::Value,
}

/// Installs `apk` and returns its package, from the package lists around the install or from
/// what an earlier install of the same file taught `known`.
pub async fn install_app(
    dev: &AdbDevice,
    apk: &Path,
    known: Option<&str>,
) -> Result<String, Failure> {
    let before = dev.shell("pm list packages -3").await?;
    dev.install(apk).await.map_err(|e| match e {
        DeviceError::Rejected(m) => Failure::new(FailureClass::BadInput, "bad_input:apk", m),
        e => e.into(),
    })?;
    let after = dev.shell("pm list packages -3").await?;
    match installed_package(&before, &after) {
        Ok(Some(p)) => Ok(p),
        Ok(None) => known.map(str::to_string).ok_or_else(|| {
            Failure::new(
                FailureClass::Infra,
                "package_unknown",
                format!(
                    "installing {} added no new package, so its package name is unknown (it was installed before this node started); restart the emulator",
                    apk.display()
                ),
            )
        }),
        Err(e) => Err(Failure::new(
            FailureClass::BadInput,
            "bad_input:apk",
            e.to_string(),
        )),
    }
}

/// Runs the payload's agent on a booted device with the app installed as `package`, then
/// grades it. `artifact_dir` receives the agent's log.
pub async fn run_on_device(
    dev: &AdbDevice,
    package: &str,
    payload: &AndroidPayload,
    inst: &AndroidInstance,
    gateway: Option<&Gateway>,
    artifact_dir: &Path,
) -> Result<Graded, Failure> {
    let max_actions = payload.max_actions as usize;
    let budget = Duration::from_secs_f64(payload.max_minutes.max(0.0) * 60.0);
    dev.clear(package).await?;
    let mut details = serde_json::json!({
        "simulator": false,
        "device": "emulator",
        "serial": dev.serial,
        "package": package,
        "bug_type": inst.bug_type.as_str(),
    });
    let mut usage = Usage::default();
    let kind = registry::agent_kind(Track::Android, &payload.agent);
    let (trace, actions, claim) = match kind {
        Some(AgentKind::Monkey) => {
            let out =
                match tokio::time::timeout(budget, monkey(dev, package, payload.seed, max_actions))
                    .await
                {
                    Ok(r) => r?,
                    Err(_) => Default::default(),
                };
            details["agent_crash"] = serde_json::json!(out.crash);
            let n = out.trace.len();
            (out.trace, n, Claim::NotAsked)
        }
        Some(AgentKind::GoldTrace) => {
            return Err(Failure::new(
                FailureClass::BadInput,
                "bad_input:agent",
                "gold-trace needs a recorded reproduction, which real bug reports do not have; run it on android-sim".into(),
            ));
        }
        _ => {
            let hard_stop = budget.mul_f64(1.1) + Duration::from_secs(30);
            let Some(report) = &inst.report else {
                return Err(Failure::new(
                    FailureClass::BadInput,
                    "bad_input:report",
                    format!(
                        "report of `{}` is missing on the node; run `reprobench datasets fetch {}`",
                        inst.instance_id, payload.dataset
                    ),
                ));
            };
            // K = 1: snapshots live inside the one emulator, so there are no replicas.
            let devices: Vec<&dyn Device> = vec![dev];
            let work = llm_agents::run(
                gateway,
                payload,
                report,
                inst.bug_type,
                &devices,
                package,
                artifact_dir,
            );
            let (run, u) = match tokio::time::timeout(hard_stop, work).await {
                Ok(r) => r.map_err(|(class, what, msg)| Failure::new(class, what, msg))?,
                Err(_) => {
                    return Err(Failure::new(
                        FailureClass::Infra,
                        "agent_timeout",
                        format!("the agent ran past its {} min budget", payload.max_minutes),
                    ));
                }
            };
            usage = u;
            let run = match run {
                Ok(run) => run,
                Err(e) => {
                    let mut f = match e {
                        AgentError::Device(e) => Failure::from(e),
                        AgentError::Llm(m) => Failure::new(FailureClass::Infra, "llm_error", m),
                        AgentError::ContextLength(m) => Failure::new(
                            FailureClass::Agent,
                            reprobench_gateway::llm::CONTEXT_LENGTH_CLASS,
                            m,
                        ),
                    };
                    f.usage = Box::new(usage);
                    return Err(f);
                }
            };
            let _ = std::fs::write(
                artifact_dir.join(format!("{}.json", payload.agent)),
                serde_json::to_vec_pretty(&run.log).unwrap_or_default(),
            );
            details["exhausted"] = serde_json::json!(run.exhausted);
            details["replay"] = gateway.is_some_and(|g| g.is_replay()).into();
            let claim = if run.claimed && run.exhausted.is_none() {
                Claim::Made
            } else {
                Claim::NotMade
            };
            details["claimed"] = run.claimed.into();
            (run.trace, run.actions_executed, claim)
        }
    };
    let crash = match inst.bug_type {
        BugType::Crash => {
            let crash = replay_for_crash(dev, package, &trace).await?;
            details["crash"] = serde_json::json!(crash);
            crash
        }
        BugType::NonCrash => None,
    };
    // The exceptions the report names, which the replay's crash must be one of.
    let reported = inst
        .report
        .as_ref()
        .map(super::device::reported_exceptions)
        .unwrap_or_default();
    details["reported_exceptions"] = serde_json::json!(reported);
    let (success, verdict) = grade(inst.bug_type, crash.as_ref(), &reported, claim);
    details["reproduced"] = success.into();
    details["verdict"] = verdict.into();
    details["trace"] = serde_json::json!(trace);
    Ok(Graded {
        success,
        verdict: verdict.into(),
        actions,
        trace,
        usage,
        details,
    })
}

/// The row of `payload`'s instance and the APK it runs on.
fn find_instance(
    settings: &EmulatorSettings,
    payload: &AndroidPayload,
) -> Result<(AndroidInstance, PathBuf), Failure> {
    let ds = load_android_dataset(&payload.dataset, &settings.datasets, None)
        .map_err(|e| Failure::new(FailureClass::BadInput, "bad_input:dataset", e.to_string()))?;
    let inst = ds
        .instances
        .into_iter()
        .find(|i| i.instance_id == payload.instance_id)
        .ok_or_else(|| {
            Failure::new(
                FailureClass::BadInput,
                "bad_input:instance",
                format!(
                    "report `{}` is not in dataset `{}` under {}",
                    payload.instance_id,
                    payload.dataset,
                    settings.datasets.display()
                ),
            )
        })?;
    let apk_name = inst
        .apk
        .clone()
        .or_else(|| {
            inst.report
                .as_ref()
                .map(|r| r.apk_name.clone())
                .filter(|n| !n.is_empty())
        })
        .ok_or_else(|| {
            Failure::new(
                FailureClass::BadInput,
                "bad_input:apk",
                format!("report `{}` names no APK", inst.instance_id),
            )
        })?;
    let apk = settings.apks.join(&apk_name);
    if !apk.is_file() {
        return Err(Failure::new(
            FailureClass::BadInput,
            "bad_input:apk",
            format!(
                "APK {apk_name} of `{}` is not at {}; put the dataset's APKs in one directory and pass it with --apks DIR",
                inst.instance_id,
                apk.display()
            ),
        ));
    }
    Ok((inst, apk))
}

/// Launches (if needed) and boots the emulator of `slot`; a failure is reported to the pool.
async fn ensure_booted(guard: &mut SlotGuard, ready: bool) -> Result<(), Failure> {
    let inner = guard.inner.clone();
    let slot = guard.slot;
    let cfg = crate::lock(&inner.pool).config.clone();
    let exited = inner
        .processes
        .lock()
        .expect("processes lock")
        .get_mut(&slot.index)
        .and_then(|e| e.exited());
    if ready {
        let Some(code) = exited else {
            return Ok(());
        };
        let d = guard.event(HealthEvent::Exited);
        return Err(Failure::new(
            FailureClass::Infra,
            "emulator_exited",
            format!(
                "the emulator of {} exited ({code}); the pool will {}",
                slot.serial(),
                decision_text(d)
            ),
        ));
    }
    let running = inner
        .processes
        .lock()
        .expect("processes lock")
        .contains_key(&slot.index)
        && exited.is_none();
    if !running {
        match Emulator::spawn(&cfg, slot) {
            Ok(e) => {
                inner
                    .processes
                    .lock()
                    .expect("processes lock")
                    .insert(slot.index, e);
            }
            Err(m) => {
                let d = guard.event(HealthEvent::Exited);
                return Err(Failure::new(
                    FailureClass::Infra,
                    "emulator_spawn",
                    format!(
                        "{m} (pass --emulator PATH); the pool will {}",
                        decision_text(d)
                    ),
                ));
            }
        }
    }
    let serial = slot.serial();
    let why = match wait_for_boot(&*inner.runner, &inner.settings.adb, &serial, &cfg).await {
        BootStatus::Ready => {
            guard.event(HealthEvent::Booted);
            return Ok(());
        }
        BootStatus::TimedOut(why) => why,
        BootStatus::Booting => "still booting".into(),
    };
    let d = guard.event(HealthEvent::BootTimedOut);
    Err(Failure::new(
        FailureClass::Infra,
        "emulator_boot",
        format!(
            "{serial} did not boot within {:?} ({why}); the pool will {}",
            cfg.boot_timeout,
            decision_text(d)
        ),
    ))
}

fn decision_text(d: Decision) -> &'static str {
    match d {
        Decision::Keep => "keep it",
        Decision::Restart => "restart it",
        Decision::Retire => "retire it",
    }
}

fn failed(f: Failure, started_at_ms: i64, start: Instant) -> AttemptEnd {
    let mut end = error(f.class, f.what, f.message);
    if let AttemptEnd::Finished(o) = &mut end {
        o.llm_calls = f.usage.calls;
        o.tokens_in = f.usage.tokens_in;
        o.tokens_out = f.usage.tokens_out;
        o.tokens_cached = f.usage.tokens_cached;
        o.cost_usd = f.usage.cost_usd;
        o.started_at_ms = started_at_ms;
        o.finished_at_ms = now_ms();
        o.wall_s = start.elapsed().as_secs_f64();
    }
    end
}

async fn attempt(inner: Arc<Inner>, spec: AttemptSpec) -> AttemptEnd {
    let started_at_ms = now_ms();
    let start = Instant::now();
    let payload: AndroidPayload = match serde_json::from_str(&spec.payload_json) {
        Ok(p) => p,
        Err(e) => {
            let f = Failure::new(
                FailureClass::BadInput,
                "bad_payload",
                format!(
                    "task {} has no valid android payload: {e}",
                    spec.instance_id
                ),
            );
            return failed(f, started_at_ms, start);
        }
    };
    if registry::agent_kind(Track::Android, &payload.agent) == Some(AgentKind::GoldTrace) {
        let f = Failure::new(
            FailureClass::BadInput,
            "bad_input:agent",
            "gold-trace needs a recorded reproduction, which real bug reports do not have; run it on android-sim".into(),
        );
        return failed(f, started_at_ms, start);
    }
    let (inst, apk) = match find_instance(&inner.settings, &payload) {
        Ok(x) => x,
        Err(f) => return failed(f, started_at_ms, start),
    };
    let taken = crate::lock(&inner.pool).acquire_any();
    let Some((slot, ready)) = taken else {
        let pool = crate::lock(&inner.pool);
        let f = Failure::new(
            FailureClass::Infra,
            "no_emulator",
            format!(
                "no emulator free ({} busy, {} of {} not retired)",
                pool.busy(),
                pool.capacity(),
                pool.config.size
            ),
        );
        return failed(f, started_at_ms, start);
    };
    let mut guard = SlotGuard {
        inner: inner.clone(),
        slot,
        freed: false,
    };
    if let Err(f) = ensure_booted(&mut guard, ready).await {
        return failed(f, started_at_ms, start);
    }
    let mut dev = AdbDevice::with_runner(
        &slot.serial(),
        &inner.settings.adb,
        ConsoleAddress::local(slot.console_port),
        "",
        Box::new(SharedRunner(inner.runner.clone())),
    );
    let apk_key = apk.display().to_string();
    let known = inner
        .packages
        .lock()
        .expect("packages lock")
        .get(&apk_key)
        .cloned();
    let package = match install_app(&dev, &apk, known.as_deref()).await {
        Ok(p) => p,
        Err(f) => {
            if f.device_down {
                guard.event(HealthEvent::ProbeFailed);
            }
            return failed(f, started_at_ms, start);
        }
    };
    inner
        .packages
        .lock()
        .expect("packages lock")
        .insert(apk_key, package.clone());
    dev.package = package.clone();
    let artifact_dir = inner
        .settings
        .artifacts
        .join(&spec.run_id)
        .join(&payload.instance_id)
        .join(format!("t{}-e{}", spec.attempt.task_id, spec.attempt.epoch));
    let _ = std::fs::create_dir_all(&artifact_dir);
    let graded = run_on_device(
        &dev,
        &package,
        &payload,
        &inst,
        inner.gateway.as_ref(),
        &artifact_dir,
    )
    .await;
    let g = match graded {
        Ok(g) => g,
        Err(f) => {
            if f.device_down {
                guard.event(HealthEvent::ProbeFailed);
            }
            return failed(f, started_at_ms, start);
        }
    };
    guard.event(HealthEvent::ProbeOk);
    let _ = std::fs::write(
        artifact_dir.join("trace.json"),
        serde_json::to_vec_pretty(&g.details).unwrap_or_default(),
    );
    let u = &g.usage;
    AttemptEnd::Finished(Outcome {
        success: g.success,
        verdict: g.verdict.clone(),
        actions: Some(g.actions as u32),
        trace_len: Some(g.trace.len() as u32),
        wall_s: start.elapsed().as_secs_f64(),
        started_at_ms,
        finished_at_ms: now_ms(),
        artifact_path: artifact_dir.display().to_string(),
        details_json: g.details.to_string(),
        llm_calls: u.calls,
        tokens_in: u.tokens_in,
        tokens_out: u.tokens_out,
        tokens_cached: u.tokens_cached,
        cost_usd: u.cost_usd,
        ..Outcome::default()
    })
}

impl Executor for EmulatorExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Emulator
    }

    fn run(&self, spec: AttemptSpec, ctx: AttemptContext) -> BoxFuture<AttemptEnd> {
        let inner = self.inner.clone();
        Box::pin(async move {
            tokio::select! {
                end = attempt(inner, spec) => end,
                _ = ctx.cancel.cancelled() => AttemptEnd::Cancelled,
            }
        })
    }
}

#[cfg(test)]
mod tests;
