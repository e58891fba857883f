//! What the docker sandbox costs the engine, as `bench slice` and `bench eval` report it: disk
//! its images use, the images its budget evicted during a run, and the engine's own floor for
//! one container. Read through the docker CLI (`system df`, `events`, `run`), as a user would
//! check them; each gives nothing (0, empty, `None`) where the CLI cannot answer.

use std::process::{Command, Stdio};

/// Disk the engine's images use, each layer counted once (`docker system df`), in bytes.
pub fn image_bytes() -> u64 {
    let out = Command::new("docker")
        .args(["system", "df", "--format", "{{.Type}}\t{{.Size}}"])
        .output();
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("Images\t").and_then(human_bytes))
        })
        .unwrap_or(0)
}

/// Docker's human sizes (`815.4MB`, `1.2GB`, `0B`: powers of 1000) in bytes.
pub fn human_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = s.split_at(split);
    let factor: f64 = match unit {
        "B" => 1.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return None,
    };
    Some((number.parse::<f64>().ok()? * factor).round() as u64)
}

/// reprobench's env and instance images untagged from `since` (Unix seconds) until now: what the
/// image budget evicted.
pub fn images_evicted_since(since: u64) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "events",
            "--since",
            &since.to_string(),
            "--until",
            &super::unix_now().to_string(),
        ])
        .args(["--filter", "type=image", "--filter", "event=untag"])
        .args(["--format", "{{.Actor.Attributes.name}}"])
        .output();
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|n| n.starts_with("reprobench/env:") || n.starts_with("reprobench/instance:"))
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

/// Counts the execution containers (those with [`super::CONTAINER_LABEL`]) the engine creates
/// while it runs: with the executions that ran, what tells how many containers booted ahead
/// went unused. A `docker events` stream from its start, since the engine keeps only its last
/// 256 events, too few to be asked afterwards.
pub struct ContainerCreations {
    events: std::process::Child,
    since_ns: u64,
}

impl ContainerCreations {
    /// Starts counting now; `None` when the CLI cannot be started.
    pub fn start() -> Option<ContainerCreations> {
        let since_ns = super::unix_ns();
        let events = Command::new("docker")
            .args(["events", "--since", &(since_ns / 1_000_000_000).to_string()])
            .args(["--filter", "type=container", "--filter", "event=create"])
            .args(["--filter", &format!("label={}", super::CONTAINER_LABEL)])
            .args(["--format", "{{.TimeNano}}"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        Some(ContainerCreations { events, since_ns })
    }

    /// Stops counting: the containers created from the start until now.
    pub fn stop(mut self) -> usize {
        let until_ns = super::unix_ns();
        let _ = self.events.kill();
        let out = self.events.wait_with_output().map(|o| o.stdout);
        created_within(
            &String::from_utf8_lossy(&out.unwrap_or_default()),
            self.since_ns,
            until_ns,
        )
    }
}

/// How many of `docker events`' times (one nanosecond time a line) fall from `since_ns` to
/// `until_ns`: the CLI takes whole seconds, the count is exact.
fn created_within(times: &str, since_ns: u64, until_ns: u64) -> usize {
    times
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .filter(|t| (since_ns..=until_ns).contains(t))
        .count()
}

/// The engine's storage driver (`overlay2`, `fuse-overlayfs`, ...), `None` when docker cannot
/// say.
pub fn storage_driver() -> Option<String> {
    let out = Command::new("docker")
        .args(["info", "--format", "{{.Driver}}"])
        .output()
        .ok()?;
    let driver = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !driver.is_empty()).then_some(driver)
}

/// CPU seconds the engine's containers have used, removed ones included: their parent cgroup
/// `docker` (the cgroupfs driver's; cgroup v1's `cpuacct.usage` or v2's `cpu.stat`); `None`
/// where there is no such cgroup (the systemd driver puts each container in a scope of its own).
pub fn containers_cpu_s() -> Option<f64> {
    if let Ok(ns) = std::fs::read_to_string("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage") {
        return ns.trim().parse::<f64>().ok().map(|ns| ns / 1e9);
    }
    let stat = std::fs::read_to_string("/sys/fs/cgroup/docker/cpu.stat").ok()?;
    cgroup2_usage_s(&stat)
}

/// `usage_usec` of a cgroup v2 `cpu.stat`, in seconds.
fn cgroup2_usage_s(cpu_stat: &str) -> Option<f64> {
    cpu_stat.lines().find_map(|l| {
        let usec = l.strip_prefix("usage_usec ")?;
        usec.trim().parse::<f64>().ok().map(|us| us / 1e6)
    })
}

/// The engine's own floor for one container on this machine: the median wall time (ms) of
/// `docker run --rm --network none IMAGE true`, `n` times, the CLI's start included; `None`
/// when docker cannot run it.
pub fn engine_floor_ms(image: &str, n: usize) -> Option<f64> {
    containers_wall_ms(image, &["--network", "none"], &["true"], n)
}

/// The median wall time (ms) of `n` containers of `image` run one after another (`docker run
/// --rm`, the CLI's start included) with the options `options`, each running `command`; `None`
/// when docker cannot run one or it fails.
pub fn containers_wall_ms(
    image: &str,
    options: &[&str],
    command: &[&str],
    n: usize,
) -> Option<f64> {
    let mut walls = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        let status = Command::new("docker")
            .args(["run", "--rm"])
            .args(options)
            .arg(image)
            .args(command)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .ok()?;
        if !status.success() {
            return None;
        }
        walls.push(t.elapsed().as_secs_f64() * 1e3);
    }
    walls.sort_by(f64::total_cmp);
    let mid = walls.len() / 2;
    match walls.len() {
        0 => None,
        len if len % 2 == 1 => Some(walls[mid]),
        _ => Some((walls[mid - 1] + walls[mid]) / 2.0),
    }
}

/// The newest instance image of the repository `repo` (`owner/name`), as the engine lists
/// them (newest first); `None` when there is none or the CLI cannot answer.
pub fn newest_instance_image(repo: &str) -> Option<String> {
    let out = Command::new("docker")
        .args([
            "images",
            "--filter",
            "label=reprobench.layer=instance",
            "--filter",
        ])
        .arg(format!("label=reprobench.repo={repo}"))
        .args(["--format", "{{.Repository}}:{{.Tag}}"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let image = text.lines().next()?.trim();
    (out.status.success() && !image.is_empty()).then(|| image.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_created_are_counted_to_the_nanosecond() {
        let times = "1000000000500\n1000000001500\nnot a time\n1000000002000\n999999999999\n";
        assert_eq!(
            created_within(times, 1_000_000_000_000, 1_000_000_001_999),
            2
        );
        assert_eq!(
            created_within(times, 1_000_000_000_000, 1_000_000_002_000),
            3
        );
        assert_eq!(created_within("", 0, u64::MAX), 0);
    }

    #[test]
    fn a_cgroup2_cpu_stat_gives_its_usage() {
        let stat = "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n";
        assert_eq!(cgroup2_usage_s(stat), Some(2.5));
        assert_eq!(cgroup2_usage_s("user_usec 1\n"), None);
    }

    #[test]
    fn docker_human_sizes_read_as_bytes() {
        assert_eq!(human_bytes("815.4MB"), Some(815_400_000));
        assert_eq!(human_bytes("1.2GB"), Some(1_200_000_000));
        assert_eq!(human_bytes("0B"), Some(0));
        assert_eq!(human_bytes("12kB"), Some(12_000));
        assert_eq!(human_bytes("many"), None);
    }
}
