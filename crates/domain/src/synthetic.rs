//! The `synthetic` dataset and agent: seeded fake work that exercises and benchmarks the cluster.
//!
//! `synthetic:N:MEAN_MS[:SIGMA]` yields N instances whose durations are log-normal with mean
//! MEAN_MS and log-space standard deviation SIGMA (default 1.0). Durations are correlated with
//! the affinity key, as test times are with a repository's image: log-duration is a per-key
//! effect (sd 0.8·SIGMA) plus a per-task effect (sd 0.6·SIGMA), so the marginal sigma stays
//! SIGMA. Keys come from a small seeded set. Nothing here runs an agent: it is load, and says so.

use serde::{Deserialize, Serialize};

/// Prefix of synthetic dataset names.
pub const DATASET_PREFIX: &str = "synthetic:";
/// The only agent that runs synthetic tasks.
pub const AGENT: &str = "synthetic";
/// Number of affinity keys in a synthetic dataset named by `synthetic:N:MEAN_MS`.
pub const DEFAULT_KEYS: u32 = 16;
/// Probability that a synthetic task succeeds.
pub const SUCCESS_PROBABILITY: f64 = 0.8;

/// A parsed `synthetic:N:MEAN_MS[:SIGMA]` dataset name.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticDataset {
    /// Number of instances.
    pub tasks: u32,
    /// Mean duration in milliseconds.
    pub mean_ms: f64,
    /// Log-space standard deviation of durations.
    pub sigma: f64,
    /// Size of the affinity key set.
    pub keys: u32,
}

/// A name that starts like a synthetic dataset's but is not one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "dataset `{name}`: write synthetic:N:MEAN_MS or synthetic:N:MEAN_MS:SIGMA, e.g. synthetic:200:20"
)]
pub struct SyntheticNameError {
    /// The name given.
    pub name: String,
}

/// One synthetic instance.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticInstance {
    /// `synthetic-00042`.
    pub instance_id: String,
    /// `synthetic-key-07`.
    pub affinity_key: String,
    /// How long the executor sleeps.
    pub duration_ms: u64,
}

/// What a synthetic task tells the executor (the grant's payload).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SyntheticPayload {
    /// How long to sleep.
    pub duration_ms: u64,
    /// Probability of success.
    pub success_probability: f64,
    /// Seed deciding success, fixed per task so every attempt agrees.
    pub seed: u64,
}

impl SyntheticPayload {
    /// Whether this task succeeds: a seeded draw, the same on every attempt and every node.
    pub fn succeeds(&self) -> bool {
        SplitMix64::new(self.seed).next_f64() < self.success_probability
    }
}

impl SyntheticDataset {
    /// Parses a dataset name; `None` when it is not a synthetic name, `Err` when it is one but malformed.
    pub fn parse(name: &str) -> Option<Result<SyntheticDataset, SyntheticNameError>> {
        let rest = name.strip_prefix(DATASET_PREFIX)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let usage = || SyntheticNameError {
            name: name.to_string(),
        };
        if !(2..=3).contains(&parts.len()) {
            return Some(Err(usage()));
        }
        let parsed = (|| {
            let tasks: u32 = parts[0].parse().ok()?;
            let mean_ms: f64 = parts[1].parse().ok()?;
            let sigma: f64 = parts.get(2).map_or(Some(1.0), |s| s.parse().ok())?;
            (tasks >= 1 && mean_ms >= 0.0 && mean_ms.is_finite() && (0.0..=4.0).contains(&sigma))
                .then_some(SyntheticDataset {
                    tasks,
                    mean_ms,
                    sigma,
                    keys: DEFAULT_KEYS,
                })
        })();
        Some(parsed.ok_or_else(usage))
    }

    /// The instances, fully determined by `seed`.
    pub fn instances(&self, seed: u64) -> Vec<SyntheticInstance> {
        let mut rng = SplitMix64::new(seed ^ 0x005E_ED0F_5A17);
        let key_sd = 0.8 * self.sigma;
        let task_sd = 0.6 * self.sigma;
        let key_effects: Vec<f64> = (0..self.keys).map(|_| key_sd * rng.next_normal()).collect();
        // The mean of a log-normal is exp(mu + sigma²/2): choose mu so the mean is mean_ms.
        let mu = self.mean_ms.max(f64::MIN_POSITIVE).ln() - self.sigma * self.sigma / 2.0;
        (0..self.tasks)
            .map(|i| {
                let key = (rng.next_u64() % u64::from(self.keys)) as usize;
                let log_d = mu + key_effects[key] + task_sd * rng.next_normal();
                let duration_ms = if self.mean_ms == 0.0 {
                    0
                } else {
                    log_d.exp().round() as u64
                };
                SyntheticInstance {
                    instance_id: format!("synthetic-{i:05}"),
                    affinity_key: format!("synthetic-key-{key:02}"),
                    duration_ms,
                }
            })
            .collect()
    }
}

/// A small, fast, seedable generator (SplitMix64) whose output never changes between versions,
/// so a seed names the same synthetic data forever.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names() {
        assert!(SyntheticDataset::parse("swt-lite").is_none());
        let d = SyntheticDataset::parse("synthetic:200:20")
            .unwrap()
            .unwrap();
        assert_eq!((d.tasks, d.mean_ms, d.sigma), (200, 20.0, 1.0));
        let d = SyntheticDataset::parse("synthetic:5:100:0")
            .unwrap()
            .unwrap();
        assert_eq!(d.sigma, 0.0);
        assert!(
            SyntheticDataset::parse("synthetic:abc:20")
                .unwrap()
                .is_err()
        );
        assert!(SyntheticDataset::parse("synthetic:10").unwrap().is_err());
    }

    #[test]
    fn durations_are_seeded_log_normal_around_the_mean() {
        let d = SyntheticDataset::parse("synthetic:20000:50")
            .unwrap()
            .unwrap();
        let a = d.instances(7);
        assert_eq!(a, d.instances(7));
        assert_ne!(a, d.instances(8));
        let mean = a.iter().map(|i| i.duration_ms as f64).sum::<f64>() / a.len() as f64;
        assert!((40.0..60.0).contains(&mean), "mean {mean}");
        let logs: Vec<f64> = a
            .iter()
            .map(|i| (i.duration_ms.max(1) as f64).ln())
            .collect();
        let lm = logs.iter().sum::<f64>() / logs.len() as f64;
        let sd = (logs.iter().map(|x| (x - lm).powi(2)).sum::<f64>() / logs.len() as f64).sqrt();
        assert!((0.85..1.15).contains(&sd), "log sd {sd}");
        let keys: std::collections::BTreeSet<_> = a.iter().map(|i| &i.affinity_key).collect();
        assert_eq!(keys.len(), DEFAULT_KEYS as usize);
    }

    #[test]
    fn zero_mean_and_zero_sigma() {
        let d = SyntheticDataset::parse("synthetic:10:0").unwrap().unwrap();
        assert!(d.instances(1).iter().all(|i| i.duration_ms == 0));
        let d = SyntheticDataset::parse("synthetic:10:300:0")
            .unwrap()
            .unwrap();
        assert!(d.instances(1).iter().all(|i| i.duration_ms == 300));
    }

    #[test]
    fn success_is_seeded() {
        let p = |seed| SyntheticPayload {
            duration_ms: 0,
            success_probability: 0.8,
            seed,
        };
        let wins = (0..10_000).filter(|s| p(*s).succeeds()).count();
        assert!((7_700..8_300).contains(&wins), "{wins}");
        assert_eq!(p(3).succeeds(), p(3).succeeds());
    }
}
