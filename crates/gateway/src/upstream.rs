//! Forwarding to one backbone: concurrency and rate limits shared by every task that uses
//! it, per-request timeouts, and retries with full-jitter exponential backoff.

use super::RetryPolicy;
use super::transcript::scrub_text;
use axum::body::Bytes;
use reprobench_domain::sweep::BackboneSpec;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};

/// Default most requests in flight per backbone.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 16;
/// Default seconds per upstream request.
pub const DEFAULT_TIMEOUT_S: u64 = 300;
/// Longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The identity of an upstream: backbones with the same name, URL and model share limits.
pub fn upstream_key(spec: &BackboneSpec) -> String {
    format!("{}\u{1f}{}\u{1f}{}", spec.name, spec.base_url, spec.model)
}

/// A token bucket refilled at `per_minute / 60` per second holding at most `per_minute`.
/// Taking always succeeds and says how long to wait, so waiters are served in order.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: f64,
    tokens: f64,
    per_second: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket allowing `per_minute` requests per minute (at least 1).
    pub fn new(per_minute: u32, now: Instant) -> TokenBucket {
        let capacity = f64::from(per_minute.max(1));
        TokenBucket {
            capacity,
            tokens: capacity,
            per_second: capacity / 60.0,
            last: now,
        }
    }

    /// Takes one token at `now`; returns how long the taker must wait before starting.
    pub fn take(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.per_second)
        }
    }
}

/// Delay before retry number `retry` (0-based): `Retry-After` (capped at 60 s) when the
/// upstream sent one, else a uniformly random time up to `min(cap, base * 2^retry)`;
/// `unit_random` is in [0, 1).
pub fn backoff_delay(
    policy: &RetryPolicy,
    retry: u32,
    retry_after: Option<Duration>,
    unit_random: f64,
) -> Duration {
    if let Some(after) = retry_after {
        return after.min(MAX_RETRY_AFTER);
    }
    let ceiling = policy
        .base
        .saturating_mul(2u32.saturating_pow(retry.min(30)))
        .min(policy.cap);
    ceiling.mul_f64(unit_random.clamp(0.0, 1.0))
}

/// Parses a `Retry-After` header given in (possibly fractional) seconds.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let secs: f64 = value.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e6)))
}

/// True for statuses worth retrying: 429 and 5xx.
pub fn is_retryable_status(status: u16) -> bool {
    status == 429 || (500..600).contains(&status)
}

/// A random u64 from the standard library's randomly keyed hasher.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

fn unit_random() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// How a forwarded call ended.
pub(crate) enum Forwarded {
    /// A whole response (success, or the last failure after retries).
    Complete {
        status: u16,
        content_type: Option<String>,
        body: Bytes,
        attempts: u32,
    },
    /// A successful streaming response whose body is still to be relayed; the permit
    /// keeps the concurrency slot until the stream ends.
    Stream {
        response: reqwest::Response,
        permit: OwnedSemaphorePermit,
        attempts: u32,
    },
    /// No HTTP response after all attempts (502 unreachable or 504 timed out).
    Failed {
        status: u16,
        message: String,
        attempts: u32,
    },
}

/// One backbone endpoint with its shared limits.
pub(crate) struct Upstream {
    pub spec: BackboneSpec,
    url: String,
    api_key: Option<String>,
    semaphore: Arc<Semaphore>,
    rate: Option<Mutex<TokenBucket>>,
    timeout: Duration,
    client: reqwest::Client,
}

impl Upstream {
    /// An upstream for `spec`; `api_key` is the value of its key variable, if any.
    pub fn new(spec: &BackboneSpec, api_key: Option<String>, client: reqwest::Client) -> Upstream {
        let url = format!("{}/chat/completions", spec.base_url.trim_end_matches('/'));
        let concurrency = spec
            .max_concurrency
            .unwrap_or(DEFAULT_MAX_CONCURRENCY)
            .max(1);
        Upstream {
            spec: spec.clone(),
            url,
            api_key,
            semaphore: Arc::new(Semaphore::new(concurrency as usize)),
            rate: spec
                .requests_per_minute
                .map(|rpm| Mutex::new(TokenBucket::new(rpm, Instant::now()))),
            timeout: Duration::from_secs(spec.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S).max(1)),
            client,
        }
    }

    /// Secrets that must never be written: the API key value.
    pub fn secrets(&self) -> Vec<String> {
        self.api_key.iter().cloned().collect()
    }

    async fn start_slot(&self) -> OwnedSemaphorePermit {
        let permit = self
            .semaphore
            .clone()
            .acquire_owned()
            .await
            .expect("the upstream semaphore is never closed");
        if let Some(rate) = &self.rate {
            let wait = rate.lock().await.take(Instant::now());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
        permit
    }

    /// Sends `body` to the backbone, retrying per `policy`.
    pub async fn forward(&self, body: Bytes, stream: bool, policy: &RetryPolicy) -> Forwarded {
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let retries_left = attempts <= policy.max_retries;
            let permit = self.start_slot().await;
            let mut request = self
                .client
                .post(&self.url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .timeout(self.timeout)
                .body(body.clone());
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let (outcome, retry_after) = match request.send().await {
                Err(e) => (self.transport_failure(&e, attempts), None),
                Ok(response) => {
                    let status = response.status().as_u16();
                    if stream && response.status().is_success() {
                        return Forwarded::Stream {
                            response,
                            permit,
                            attempts,
                        };
                    }
                    let retry_after = response
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(parse_retry_after);
                    let content_type = response
                        .headers()
                        .get(reqwest::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    match response.bytes().await {
                        Ok(body) => (
                            Forwarded::Complete {
                                status,
                                content_type,
                                body,
                                attempts,
                            },
                            retry_after,
                        ),
                        Err(e) => (self.transport_failure(&e, attempts), None),
                    }
                }
            };
            drop(permit);
            let retryable = match &outcome {
                Forwarded::Complete { status, .. } => is_retryable_status(*status),
                Forwarded::Failed { .. } => true,
                Forwarded::Stream { .. } => false,
            };
            if !retryable || !retries_left {
                return outcome;
            }
            let delay = backoff_delay(policy, attempts - 1, retry_after, unit_random());
            tracing::debug!(
                backbone = %self.spec.name,
                attempt = attempts,
                delay_ms = delay.as_millis() as u64,
                "retrying upstream call"
            );
            tokio::time::sleep(delay).await;
        }
    }

    fn transport_failure(&self, error: &reqwest::Error, attempts: u32) -> Forwarded {
        let (status, what) = if error.is_timeout() {
            (
                504,
                format!(
                    "timed out after {} s (raise timeout_s of the backbone if calls are legitimately slow)",
                    self.timeout.as_secs()
                ),
            )
        } else {
            (502, format!("could not be reached: {error}"))
        };
        Forwarded::Failed {
            status,
            message: scrub_text(
                &format!(
                    "backbone `{}` at {} {what} ({attempts} attempts)",
                    self.spec.name, self.url
                ),
                &self.secrets(),
            ),
            attempts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_retries: 5,
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
        }
    }

    #[test]
    fn backoff_is_full_jitter_under_a_growing_capped_ceiling() {
        let p = policy();
        assert_eq!(backoff_delay(&p, 0, None, 0.0), Duration::ZERO);
        assert_eq!(backoff_delay(&p, 0, None, 0.5), Duration::from_millis(250));
        assert_eq!(backoff_delay(&p, 3, None, 0.5), Duration::from_secs(2));
        assert_eq!(backoff_delay(&p, 20, None, 0.5), Duration::from_secs(15));
        assert_eq!(backoff_delay(&p, 40, None, 1.0), Duration::from_secs(30));
    }

    #[test]
    fn retry_after_is_honoured_up_to_a_minute() {
        let p = policy();
        assert_eq!(
            backoff_delay(&p, 0, Some(Duration::from_secs(7)), 0.1),
            Duration::from_secs(7)
        );
        assert_eq!(
            backoff_delay(&p, 0, Some(Duration::from_secs(600)), 0.1),
            MAX_RETRY_AFTER
        );
        assert_eq!(parse_retry_after(" 2 "), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }

    #[test]
    fn token_bucket_spaces_requests_after_the_burst() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(60, t0);
        for _ in 0..60 {
            assert_eq!(bucket.take(t0), Duration::ZERO);
        }
        assert_eq!(bucket.take(t0), Duration::from_secs(1));
        assert_eq!(bucket.take(t0), Duration::from_secs(2));
        // Three seconds later three tokens came back, two of them already promised.
        assert_eq!(bucket.take(t0 + Duration::from_secs(3)), Duration::ZERO);
    }

    #[test]
    fn retryable_statuses() {
        assert!(is_retryable_status(429));
        assert!(is_retryable_status(503));
        assert!(!is_retryable_status(400));
        assert!(!is_retryable_status(200));
    }

    #[test]
    fn random_values_differ_and_unit_is_in_range() {
        assert_ne!(random_u64(), random_u64());
        let u = unit_random();
        assert!((0.0..1.0).contains(&u));
    }
}
