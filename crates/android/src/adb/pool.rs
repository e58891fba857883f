//! An emulator pool per node: port allocation, the headless launch command, boot detection
//! and the restart policy.
//!
//! The decisions are pure ([`BootWatch`], [`SlotHealth::on`]); [`wait_for_boot`] and
//! [`probe`] do the IO through a [`Runner`] and tokio's clock, which tests pause and advance
//! (`#[tokio::test(start_paused = true)]`), so no test waits in real time.

use super::adb::Runner;
use super::commands::{BOOT_PROBE, parse_boot_state};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

/// The first console port the emulator uses.
pub const FIRST_CONSOLE_PORT: u16 = 5554;
/// The last console port adb scans (5682): at most 65 emulators per host.
pub const LAST_CONSOLE_PORT: u16 = 5682;

/// Most emulators one host can run: the console ports from 5554 to 5682, two apart.
const MAX_EMULATORS: u16 = (LAST_CONSOLE_PORT - FIRST_CONSOLE_PORT) / 2 + 1;

/// Why a pool could not be set up or an emulator not started.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// More slots were asked for than have console (or gRPC) ports.
    #[error(
        "pool size {size} too large: console ports end at {LAST_CONSOLE_PORT}, so at most {MAX_EMULATORS} emulators (and the gRPC ports from {grpc_base} must fit)"
    )]
    TooManySlots { size: u16, grpc_base: u16 },
    /// The emulator binary could not be started.
    #[error(
        "cannot start {program}: {source} (install the Android emulator and point the pool at it)"
    )]
    Spawn {
        program: String,
        source: std::io::Error,
    },
}

/// One emulator's place in the pool and its ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Position in the pool (0-based).
    pub index: u16,
    /// Console port: 5554 + 2·index.
    pub console_port: u16,
    /// adb port: console + 1.
    pub adb_port: u16,
    /// gRPC controller port: grpc_base + index.
    pub grpc_port: u16,
}

impl Slot {
    /// Slot `index`, or `None` when its console port would pass 5682.
    pub fn new(index: u16, grpc_base: u16) -> Option<Slot> {
        let console_port = FIRST_CONSOLE_PORT.checked_add(index.checked_mul(2)?)?;
        (console_port <= LAST_CONSOLE_PORT).then_some(Slot {
            index,
            console_port,
            adb_port: console_port + 1,
            grpc_port: grpc_base.checked_add(index)?,
        })
    }

    /// The adb serial, `emulator-<console port>`.
    pub fn serial(&self) -> String {
        format!("emulator-{}", self.console_port)
    }
}

/// How a node runs its emulators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The `emulator` binary.
    pub emulator: PathBuf,
    /// The AVD every slot runs (read-only, so several instances share it).
    pub avd: String,
    /// How many emulators (≈ 2 cores and 2–4 GB each; KVM required).
    pub size: u16,
    /// The first gRPC port.
    pub grpc_base: u16,
    /// How long a boot may take.
    pub boot_timeout: Duration,
    /// How often boot completion is polled.
    pub poll_every: Duration,
    /// Consecutive failed health probes before a restart.
    pub max_probe_failures: u32,
    /// Restarts before a slot is retired.
    pub max_restarts: u32,
}

impl PoolConfig {
    /// Defaults for `avd`: one emulator, gRPC from 8554, 180 s boots polled every 2 s.
    pub fn new(emulator: &Path, avd: &str) -> PoolConfig {
        PoolConfig {
            emulator: emulator.to_path_buf(),
            avd: avd.to_string(),
            size: 1,
            grpc_base: 8554,
            boot_timeout: Duration::from_secs(180),
            poll_every: Duration::from_secs(2),
            max_probe_failures: 3,
            max_restarts: 2,
        }
    }

    /// Every slot, or an error saying how many fit.
    pub fn slots(&self) -> Result<Vec<Slot>, PoolError> {
        (0..self.size)
            .map(|i| {
                Slot::new(i, self.grpc_base).ok_or(PoolError::TooManySlots {
                    size: self.size,
                    grpc_base: self.grpc_base,
                })
            })
            .collect()
    }

    /// The headless launch argv (program first) for `slot`.
    pub fn launch_argv(&self, slot: &Slot) -> Vec<String> {
        let mut argv = vec![self.emulator.display().to_string()];
        argv.extend(
            [
                "-avd",
                &self.avd,
                "-no-window",
                "-no-audio",
                "-no-boot-anim",
                "-gpu",
                "swiftshader_indirect",
                "-read-only",
                "-no-snapshot-save",
                "-port",
                &slot.console_port.to_string(),
                "-grpc",
                &slot.grpc_port.to_string(),
            ]
            .map(String::from),
        );
        argv
    }
}

/// A running emulator process of one slot.
#[derive(Debug)]
pub struct Emulator {
    /// Its slot.
    pub slot: Slot,
    child: tokio::process::Child,
}

impl Emulator {
    /// Launches `cfg`'s AVD headless in `slot` (output discarded; killed when dropped).
    pub fn spawn(cfg: &PoolConfig, slot: Slot) -> Result<Emulator, PoolError> {
        let argv = cfg.launch_argv(&slot);
        let child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| PoolError::Spawn {
                program: argv[0].clone(),
                source,
            })?;
        Ok(Emulator { slot, child })
    }

    /// The exit code once the process has ended (`Some(-1)` for a signal); `None` while running.
    pub fn exited(&mut self) -> Option<i32> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.code().unwrap_or(-1)),
            Ok(None) => None,
            Err(_) => Some(-1),
        }
    }

    /// Kills the process and waits for it.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The slots of one node: which are free, busy, booting or retired.
#[derive(Debug, Clone)]
pub struct Pool {
    /// The configuration.
    pub config: PoolConfig,
    slots: Vec<(Slot, SlotHealth, bool)>, // (slot, health, busy)
}

impl Pool {
    /// A pool of `config.size` slots, none booted yet.
    pub fn new(config: PoolConfig) -> Result<Pool, PoolError> {
        let slots = config
            .slots()?
            .into_iter()
            .map(|s| (s, SlotHealth::default(), false))
            .collect();
        Ok(Pool { config, slots })
    }

    /// Every slot.
    pub fn slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().map(|(s, _, _)| s)
    }

    /// Slots not retired (what the node can offer once they boot).
    pub fn capacity(&self) -> usize {
        self.slots.iter().filter(|(_, h, _)| !h.retired).count()
    }

    /// Takes a ready, free slot for a task.
    pub fn acquire(&mut self) -> Option<Slot> {
        let (slot, _, busy) = self
            .slots
            .iter_mut()
            .find(|(_, h, busy)| h.ready && !h.retired && !*busy)?;
        *busy = true;
        Some(*slot)
    }

    /// Takes a free slot that is not retired, preferring booted ones; `true` when it is booted
    /// (otherwise the caller boots it and reports [`HealthEvent::Booted`]).
    pub fn acquire_any(&mut self) -> Option<(Slot, bool)> {
        let pick = self
            .slots
            .iter()
            .position(|(_, h, busy)| h.ready && !h.retired && !*busy)
            .or_else(|| {
                self.slots
                    .iter()
                    .position(|(_, h, busy)| !h.retired && !*busy)
            })?;
        let (slot, health, busy) = &mut self.slots[pick];
        *busy = true;
        Some((*slot, health.ready))
    }

    /// Slots in use.
    pub fn busy(&self) -> usize {
        self.slots.iter().filter(|(_, _, busy)| *busy).count()
    }

    /// Gives a slot back.
    pub fn release(&mut self, slot: &Slot) {
        if let Some(e) = self.slots.iter_mut().find(|(s, _, _)| s == slot) {
            e.2 = false;
        }
    }

    /// Records `event` for `slot` and says what to do; a restarted or retired slot is freed.
    pub fn on(&mut self, slot: &Slot, event: HealthEvent) -> Decision {
        let cfg = &self.config;
        let Some((_, health, busy)) = self.slots.iter_mut().find(|(s, _, _)| s == slot) else {
            return Decision::Keep;
        };
        let d = health.on(event, cfg);
        if d != Decision::Keep {
            *busy = false;
        }
        d
    }
}

/// What one boot poll saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The boot properties answered; `true` when booted (see [`parse_boot_state`]).
    Answered(bool),
    /// adb could not reach the device yet (normal early in a boot).
    Unreachable(String),
}

/// Where a boot stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootStatus {
    /// Still booting: poll again.
    Booting,
    /// Booted.
    Ready,
    /// The deadline passed; the last thing seen says why.
    TimedOut(String),
}

/// Boot detection as a pure state machine over explicit instants.
#[derive(Debug, Clone)]
pub struct BootWatch {
    deadline: Instant,
    last: String,
}

impl BootWatch {
    /// A boot started at `started` that must finish within `timeout`.
    pub fn new(started: Instant, timeout: Duration) -> BootWatch {
        BootWatch {
            deadline: started + timeout,
            last: "no poll yet".into(),
        }
    }

    /// Takes in a poll made at `now`.
    pub fn observe(&mut self, now: Instant, probe: Probe) -> BootStatus {
        match probe {
            Probe::Answered(true) => return BootStatus::Ready,
            Probe::Answered(false) => {
                self.last = "sys.boot_completed is not 1 (or the boot animation runs) yet".into()
            }
            Probe::Unreachable(e) => self.last = e,
        }
        if now >= self.deadline {
            BootStatus::TimedOut(self.last.clone())
        } else {
            BootStatus::Booting
        }
    }
}

/// One boot poll of `serial` (`sys.boot_completed` and `init.svc.bootanim`).
pub async fn probe(runner: &dyn Runner, adb: &Path, serial: &str, timeout: Duration) -> Probe {
    let args: Vec<String> = ["-s", serial, "shell", BOOT_PROBE]
        .map(String::from)
        .to_vec();
    match runner.run(adb, &args, timeout).await {
        Ok(out) if out.code == 0 => Probe::Answered(parse_boot_state(&out.text())),
        Ok(out) => Probe::Unreachable(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        Err(e) => Probe::Unreachable(e.to_string()),
    }
}

/// Polls until `serial` has booted or `cfg.boot_timeout` passes.
pub async fn wait_for_boot(
    runner: &dyn Runner,
    adb: &Path,
    serial: &str,
    cfg: &PoolConfig,
) -> BootStatus {
    let mut watch = BootWatch::new(Instant::now(), cfg.boot_timeout);
    loop {
        let p = probe(
            runner,
            adb,
            serial,
            cfg.poll_every.max(Duration::from_secs(5)),
        )
        .await;
        match watch.observe(Instant::now(), p) {
            BootStatus::Booting => tokio::time::sleep(cfg.poll_every).await,
            done => return done,
        }
    }
}

/// What happened to a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthEvent {
    /// The boot finished.
    Booted,
    /// The boot did not finish in time.
    BootTimedOut,
    /// A health probe succeeded.
    ProbeOk,
    /// A health probe failed.
    ProbeFailed,
    /// The emulator process exited.
    Exited,
}

/// What to do with a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Leave it as it is.
    Keep,
    /// Kill the emulator and launch it again.
    Restart,
    /// Stop using the slot (it failed too often; the node reports less capacity).
    Retire,
}

/// A slot's health record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotHealth {
    /// Whether it has booted and serves devices.
    pub ready: bool,
    /// Failed probes in a row.
    pub probe_failures: u32,
    /// Restarts so far.
    pub restarts: u32,
    /// Whether it was retired.
    pub retired: bool,
}

impl SlotHealth {
    /// Applies `event` under `cfg`'s limits and says what to do.
    pub fn on(&mut self, event: HealthEvent, cfg: &PoolConfig) -> Decision {
        if self.retired {
            return Decision::Retire;
        }
        let failed = match event {
            HealthEvent::Booted | HealthEvent::ProbeOk => {
                self.ready = true;
                self.probe_failures = 0;
                false
            }
            HealthEvent::ProbeFailed => {
                self.probe_failures += 1;
                self.probe_failures >= cfg.max_probe_failures
            }
            HealthEvent::BootTimedOut | HealthEvent::Exited => true,
        };
        if !failed {
            return Decision::Keep;
        }
        self.ready = false;
        self.probe_failures = 0;
        if self.restarts >= cfg.max_restarts {
            self.retired = true;
            Decision::Retire
        } else {
            self.restarts += 1;
            Decision::Restart
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adb::adb::{Output, tests::Replay};

    fn cfg() -> PoolConfig {
        PoolConfig::new(Path::new("/opt/android/emulator/emulator"), "pixel_34")
    }

    #[test]
    fn ports_and_argv() {
        let s = Slot::new(2, 8554).unwrap();
        assert_eq!(
            (s.console_port, s.adb_port, s.grpc_port),
            (5558, 5559, 8556)
        );
        assert_eq!(s.serial(), "emulator-5558");
        assert_eq!(Slot::new(64, 8554).unwrap().console_port, 5682);
        assert!(Slot::new(65, 8554).is_none());
        assert_eq!(
            cfg().launch_argv(&s).join(" "),
            "/opt/android/emulator/emulator -avd pixel_34 -no-window -no-audio -no-boot-anim -gpu swiftshader_indirect -read-only -no-snapshot-save -port 5558 -grpc 8556"
        );
        let mut c = cfg();
        c.size = 3;
        assert_eq!(c.slots().unwrap().len(), 3);
        c.size = 70;
        assert_eq!(
            c.slots().unwrap_err().to_string(),
            "pool size 70 too large: console ports end at 5682, so at most 65 emulators (and the gRPC ports from 8554 must fit)"
        );
    }

    #[test]
    fn boot_watch_transitions() {
        let t0 = Instant::now();
        let mut w = BootWatch::new(t0, Duration::from_secs(10));
        assert_eq!(
            w.observe(t0, Probe::Unreachable("device offline".into())),
            BootStatus::Booting
        );
        assert_eq!(
            w.observe(t0 + Duration::from_secs(5), Probe::Answered(false)),
            BootStatus::Booting
        );
        assert_eq!(
            w.observe(t0 + Duration::from_secs(10), Probe::Answered(false)),
            BootStatus::TimedOut(
                "sys.boot_completed is not 1 (or the boot animation runs) yet".into()
            )
        );
        let mut w = BootWatch::new(t0, Duration::from_secs(10));
        assert_eq!(
            w.observe(t0 + Duration::from_secs(99), Probe::Answered(true)),
            BootStatus::Ready
        );
    }

    #[tokio::test(start_paused = true)]
    async fn waits_for_boot_with_paused_clock() {
        let r = Replay::default();
        r.on_output(
            "getprop init.svc.bootanim",
            Output {
                code: 1,
                stdout: vec![],
                stderr: b"error: device offline".to_vec(),
            },
        )
        .on("getprop init.svc.bootanim", "1\nrunning\n")
        .on("getprop init.svc.bootanim", "1\nstopped\n");
        let start = Instant::now();
        let st = wait_for_boot(&r, Path::new("adb"), "emulator-5554", &cfg()).await;
        assert_eq!(st, BootStatus::Ready);
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        assert_eq!(
            r.calls()[0],
            format!("adb -s emulator-5554 shell {BOOT_PROBE}")
        );

        // Never boots: times out after the deadline with the last reason.
        let r = Replay::default();
        for _ in 0..200 {
            r.on("getprop init.svc.bootanim", "0\n\n");
        }
        let mut c = cfg();
        c.boot_timeout = Duration::from_secs(30);
        let st = wait_for_boot(&r, Path::new("adb"), "emulator-5554", &c).await;
        assert_eq!(
            st,
            BootStatus::TimedOut(
                "sys.boot_completed is not 1 (or the boot animation runs) yet".into()
            )
        );
        assert_eq!(r.calls().len(), 16);
    }

    #[tokio::test]
    async fn spawn_detects_exit_and_missing_binary() {
        // `sh -avd ...` fails at once, standing in for an emulator that dies on start.
        let mut c = cfg();
        c.emulator = "sh".into();
        let mut e = Emulator::spawn(&c, Slot::new(0, 8554).unwrap()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while e.exited().is_none() {
            assert!(std::time::Instant::now() < deadline, "sh did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_ne!(e.exited(), Some(0));
        e.kill().await;
        c.emulator = "/nonexistent/emulator".into();
        let err = Emulator::spawn(&c, Slot::new(0, 8554).unwrap()).unwrap_err();
        assert!(err.to_string().contains("install the Android emulator"));
    }

    #[test]
    fn pool_hands_out_ready_slots() {
        let mut c = cfg();
        c.size = 2;
        c.max_restarts = 0;
        let mut p = Pool::new(c).unwrap();
        let [a, b]: [Slot; 2] = p.slots().copied().collect::<Vec<_>>().try_into().unwrap();
        assert_eq!(p.acquire(), None, "nothing booted yet");
        assert_eq!(p.on(&a, HealthEvent::Booted), Decision::Keep);
        assert_eq!(p.acquire(), Some(a));
        assert_eq!(p.acquire(), None, "a is busy, b not booted");
        p.release(&a);
        assert_eq!(p.acquire(), Some(a));
        assert_eq!(p.on(&a, HealthEvent::Exited), Decision::Retire);
        assert_eq!(p.capacity(), 1);
        p.on(&b, HealthEvent::Booted);
        assert_eq!(p.acquire(), Some(b));
        assert_eq!(p.acquire(), None);
    }

    #[test]
    fn acquire_any_prefers_booted_slots() {
        let mut c = cfg();
        c.size = 2;
        let mut p = Pool::new(c).unwrap();
        let [a, b]: [Slot; 2] = p.slots().copied().collect::<Vec<_>>().try_into().unwrap();
        p.on(&b, HealthEvent::Booted);
        assert_eq!(p.acquire_any(), Some((b, true)));
        assert_eq!(p.acquire_any(), Some((a, false)));
        assert_eq!(p.busy(), 2);
        assert_eq!(p.acquire_any(), None);
        p.release(&a);
        assert_eq!(p.busy(), 1);
    }

    #[test]
    fn restart_policy() {
        let c = cfg(); // 3 probe failures, 2 restarts
        let mut h = SlotHealth::default();
        assert_eq!(h.on(HealthEvent::Booted, &c), Decision::Keep);
        assert!(h.ready);
        assert_eq!(h.on(HealthEvent::ProbeFailed, &c), Decision::Keep);
        assert_eq!(h.on(HealthEvent::ProbeOk, &c), Decision::Keep);
        assert_eq!(h.on(HealthEvent::ProbeFailed, &c), Decision::Keep);
        assert_eq!(h.on(HealthEvent::ProbeFailed, &c), Decision::Keep);
        assert_eq!(h.on(HealthEvent::ProbeFailed, &c), Decision::Restart);
        assert!(!h.ready);
        assert_eq!(h.on(HealthEvent::BootTimedOut, &c), Decision::Restart);
        assert_eq!(h.restarts, 2);
        assert_eq!(h.on(HealthEvent::Exited, &c), Decision::Retire);
        assert_eq!(h.on(HealthEvent::Booted, &c), Decision::Retire);
    }
}
