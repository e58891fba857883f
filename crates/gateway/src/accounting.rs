//! Pure accounting: token usage from upstream responses, cost from prices, budget checks.

use reprobench_domain::sweep::Price;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// What a task (or the whole gateway) has used so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Successful completions.
    pub calls: u64,
    /// Prompt tokens, cached ones included.
    pub tokens_in: u64,
    /// Completion tokens.
    pub tokens_out: u64,
    /// Prompt tokens served from the provider's cache.
    pub tokens_cached: u64,
    /// Dollars, from the backbone's prices.
    pub cost_usd: f64,
    /// Calls that ended in an error after all retries.
    pub failed_calls: u64,
    /// Upstream attempts repeated after a retryable failure.
    pub retries: u64,
    /// Calls refused because a budget was exhausted.
    pub budget_rejections: u64,
    /// Wall-clock seconds spent in calls (gateway receipt to last byte).
    pub llm_seconds: f64,
    /// True when the answers came from a recorded transcript, not a live backbone.
    pub replay: bool,
    /// Successful calls whose answer carried no `usage`: their tokens (and so their cost) are
    /// estimates from the request's and the answer's text, about four characters a token.
    #[serde(default)]
    pub calls_without_usage: u64,
}

impl Usage {
    /// Adds another usage into this one (`replay` is true if either is).
    pub fn add(&mut self, other: &Usage) {
        self.calls += other.calls;
        self.tokens_in += other.tokens_in;
        self.tokens_out += other.tokens_out;
        self.tokens_cached += other.tokens_cached;
        self.cost_usd += other.cost_usd;
        self.failed_calls += other.failed_calls;
        self.retries += other.retries;
        self.budget_rejections += other.budget_rejections;
        self.llm_seconds += other.llm_seconds;
        self.replay |= other.replay;
        self.calls_without_usage += other.calls_without_usage;
    }
}

/// Characters per token in the estimate used when an answer has no `usage`.
pub const CHARS_PER_ESTIMATED_TOKEN: u64 = 4;

/// The text a model reads or writes in `v` (strings under `content`, `text`, `arguments` and
/// `reasoning_content`, anywhere inside it), measured by `len`.
fn text_len(v: &Value, len: fn(&str) -> u64) -> u64 {
    match v {
        Value::Array(items) => items.iter().map(|i| text_len(i, len)).sum(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| match (k.as_str(), v) {
                ("content" | "text" | "arguments" | "reasoning_content", Value::String(s)) => {
                    len(s)
                }
                _ => text_len(v, len),
            })
            .sum(),
        _ => 0,
    }
}

/// Characters of the text a model reads or writes in `v` (see [`text_len`]).
fn text_chars(v: &Value) -> u64 {
    text_len(v, |s| s.chars().count() as u64)
}

/// Bytes of the text a model reads in `v` (see [`text_len`]).
fn text_bytes(v: &Value) -> u64 {
    text_len(v, |s| s.len() as u64)
}

fn chars_to_tokens(chars: u64) -> u64 {
    chars.div_ceil(CHARS_PER_ESTIMATED_TOKEN)
}

/// Token counts of one completion, as reported by the upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCounts {
    /// `prompt_tokens` (cached ones included).
    pub prompt: u64,
    /// `completion_tokens`.
    pub completion: u64,
    /// `prompt_tokens_details.cached_tokens`, or DeepSeek's `prompt_cache_hit_tokens`.
    pub cached: u64,
}

impl TokenCounts {
    /// Reads an OpenAI `usage` object; `None` when it is absent or null.
    pub fn from_usage(usage: &Value) -> Option<TokenCounts> {
        let usage = usage.as_object()?;
        let num = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
        let cached = usage
            .get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64)
            .or_else(|| usage.get("prompt_cache_hit_tokens").and_then(Value::as_u64))
            .unwrap_or(0);
        Some(TokenCounts {
            prompt: num(usage.get("prompt_tokens")),
            completion: num(usage.get("completion_tokens")),
            cached,
        })
    }

    /// Reads the `usage` of a chat-completion response (or stream chunk).
    pub fn from_response(response: &Value) -> Option<TokenCounts> {
        TokenCounts::from_usage(response.get("usage")?)
    }

    /// An estimate for a call whose answer had no `usage`: the request's messages (and tool
    /// definitions) in, the answer's choices out (one answer, or a stream's chunks), at
    /// [`CHARS_PER_ESTIMATED_TOKEN`] characters a token.
    pub fn estimate(request: &Value, response: &Value) -> TokenCounts {
        let tools = request
            .get("tools")
            .map_or(0, |t| t.to_string().chars().count() as u64);
        let prompt = request.get("messages").map_or(0, text_chars) + tools;
        let completion = match response {
            Value::Array(chunks) => chunks
                .iter()
                .map(|c| c.get("choices").map_or(0, text_chars))
                .sum(),
            one => one.get("choices").map_or(0, text_chars),
        };
        TokenCounts {
            prompt: chars_to_tokens(prompt),
            completion: chars_to_tokens(completion),
            cached: 0,
        }
    }

    /// Dollars these tokens cost at `price` (cached input at the cached rate).
    pub fn cost_usd(&self, price: &Price) -> f64 {
        let cached = self.cached.min(self.prompt);
        let uncached = self.prompt - cached;
        (uncached as f64 * price.input_per_mtok
            + cached as f64 * price.cached_input_per_mtok
            + self.completion as f64 * price.output_per_mtok)
            / 1e6
    }

    /// The usage of one successful call with these tokens.
    pub fn as_call_usage(&self, price: &Price) -> Usage {
        Usage {
            calls: 1,
            tokens_in: self.prompt,
            tokens_out: self.completion,
            tokens_cached: self.cached.min(self.prompt),
            cost_usd: self.cost_usd(price),
            ..Usage::default()
        }
    }
}

/// Prompt tokens a message may cost beyond its text (the chat template's role and separators).
const TEMPLATE_TOKENS_PER_MESSAGE: u64 = 16;
/// Prompt tokens an image may cost at most (a high-detail image of the largest size providers
/// take is under 1,600 tokens at OpenAI's tile rate; other providers' are smaller).
const TOKENS_PER_IMAGE: u64 = 2_000;

/// What an admitted call holds against its task's tokens and dollars until its usage is known:
/// its worst case, so that calls in flight together cannot overspend a budget by more than one
/// call's reservation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reservation {
    /// Prompt tokens (at most one per byte of text, as byte-level tokenizers have no token
    /// shorter than a byte) plus the call's output limit.
    pub tokens: u64,
    /// Those tokens at the backbone's uncached input and output prices.
    pub cost_usd: f64,
}

impl Reservation {
    /// The worst case of `request` (its messages and tools) answered with up to `output_tokens`.
    pub fn of(request: &Value, output_tokens: u64, price: &Price) -> Reservation {
        let messages = request.get("messages").and_then(Value::as_array);
        let text = messages.map_or(0, |m| m.iter().map(text_bytes).sum::<u64>());
        let images = messages.map_or(0, |m| m.iter().map(images_in).sum::<u64>());
        let tools = request
            .get("tools")
            .map_or(0, |t| t.to_string().len() as u64);
        let template = messages.map_or(0, |m| m.len() as u64) * TEMPLATE_TOKENS_PER_MESSAGE;
        let prompt = text + tools + template + images * TOKENS_PER_IMAGE;
        Reservation {
            tokens: prompt + output_tokens,
            cost_usd: (prompt as f64 * price.input_per_mtok
                + output_tokens as f64 * price.output_per_mtok)
                / 1e6,
        }
    }

    /// Adds `other` (a call admitted).
    pub fn add(&mut self, other: &Reservation) {
        self.tokens += other.tokens;
        self.cost_usd += other.cost_usd;
    }

    /// Takes `other` away (a call whose usage is now known).
    pub fn release(&mut self, other: &Reservation) {
        self.tokens = self.tokens.saturating_sub(other.tokens);
        self.cost_usd = (self.cost_usd - other.cost_usd).max(0.0);
    }
}

/// Images (`image_url` parts) in `v`.
fn images_in(v: &Value) -> u64 {
    match v {
        Value::Array(items) => items.iter().map(images_in).sum(),
        Value::Object(map) => {
            u64::from(map.get("type").and_then(Value::as_str) == Some("image_url"))
                + map.values().map(images_in).sum::<u64>()
        }
        _ => 0,
    }
}

/// Request fields that limit a completion's output tokens, the current one first.
const OUTPUT_LIMIT_FIELDS: [&str; 2] = ["max_completion_tokens", "max_tokens"];

/// Makes `request` ask for at most `cap` output tokens: a limit it sets above `cap` is lowered
/// to it, and a request without one gets `max_tokens = cap`. Returns the limit it now has.
pub fn cap_output_tokens(request: &mut serde_json::Map<String, Value>, cap: u64) -> u64 {
    let mut limit = None;
    for field in OUTPUT_LIMIT_FIELDS {
        if let Some(value) = request.get_mut(field) {
            let asked = value.as_u64().unwrap_or(u64::MAX).min(cap);
            *value = Value::from(asked);
            limit = Some(limit.map_or(asked, |l: u64| l.min(asked)));
        }
    }
    limit.unwrap_or_else(|| {
        request.insert("max_tokens".into(), Value::from(cap));
        cap
    })
}

/// Per-task limits checked before each call; `None` means unlimited.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskBudget {
    /// Upstream calls (successful, failed and in flight).
    pub max_calls: Option<u64>,
    /// Tokens in plus tokens out.
    pub max_tokens: Option<u64>,
    /// Dollars.
    pub max_cost_usd: Option<f64>,
    /// Time since the task was opened.
    pub max_duration: Option<Duration>,
}

/// A budget that is used up: which one, how much was used, and the limit.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetExhausted {
    /// `calls`, `tokens`, `cost` or `time`.
    pub which: &'static str,
    /// Amount used, formatted with its unit.
    pub used: String,
    /// The limit, formatted with its unit.
    pub limit: String,
}

impl BudgetExhausted {
    /// The message returned to the agent, e.g. `task T: calls budget exhausted (used 3, limit 3)`.
    pub fn message(&self, task: &str) -> String {
        format!(
            "task {task}: {} budget exhausted (used {}, limit {})",
            self.which, self.used, self.limit
        )
    }
}

impl TaskBudget {
    /// Checks whether one more call is allowed, given the usage so far, the calls in
    /// flight and the time since the task was opened.
    pub fn check(
        &self,
        used: &Usage,
        in_flight: u64,
        reserved: &Reservation,
        elapsed: Duration,
    ) -> Result<(), BudgetExhausted> {
        let held = |what: String, reserved: bool| {
            if reserved {
                format!("{what}, with what calls in flight may still use")
            } else {
                what
            }
        };
        if let Some(limit) = self.max_calls {
            let calls = used.calls + used.failed_calls + in_flight;
            if calls >= limit {
                return Err(BudgetExhausted {
                    which: "calls",
                    used: calls.to_string(),
                    limit: limit.to_string(),
                });
            }
        }
        if let Some(limit) = self.max_tokens {
            let tokens = used.tokens_in + used.tokens_out + reserved.tokens;
            if tokens >= limit {
                return Err(BudgetExhausted {
                    which: "tokens",
                    used: held(format!("{tokens} tokens"), reserved.tokens > 0),
                    limit: format!("{limit} tokens"),
                });
            }
        }
        if let Some(limit) = self.max_cost_usd
            && used.cost_usd + reserved.cost_usd >= limit
        {
            return Err(BudgetExhausted {
                which: "cost",
                used: held(
                    format!("${:.4}", used.cost_usd + reserved.cost_usd),
                    reserved.cost_usd > 0.0,
                ),
                limit: format!("${limit:.4}"),
            });
        }
        if let Some(limit) = self.max_duration
            && elapsed >= limit
        {
            return Err(BudgetExhausted {
                which: "time",
                used: format!("{:.1}s", elapsed.as_secs_f64()),
                limit: format!("{:.1}s", limit.as_secs_f64()),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn price() -> Price {
        Price {
            input_per_mtok: 2.0,
            output_per_mtok: 8.0,
            cached_input_per_mtok: 0.5,
        }
    }

    #[test]
    fn an_answer_without_usage_is_charged_an_estimate_that_budgets_see() {
        let request = json!({"messages": [
            {"role": "system", "content": "x".repeat(400)},
            {"role": "user", "content": [{"type": "text", "text": "y".repeat(399)}]}
        ]});
        let answer =
            json!({"choices": [{"message": {"role": "assistant", "content": "z".repeat(81)}}]});
        let est = TokenCounts::estimate(&request, &answer);
        assert_eq!((est.prompt, est.completion), (200, 21));
        // A stream's chunks count the same as one answer.
        let chunks = json!([
            {"choices": [{"delta": {"role": "assistant", "content": "z".repeat(40)}}]},
            {"choices": [{"delta": {"content": "z".repeat(41)}}]},
            {"choices": [{"delta": {}, "finish_reason": "stop"}]}
        ]);
        assert_eq!(TokenCounts::estimate(&request, &chunks), est);
        let usage = est.as_call_usage(&price());
        assert!(usage.cost_usd > 0.0);
        let budget = TaskBudget {
            max_cost_usd: Some(usage.cost_usd / 2.0),
            ..TaskBudget::default()
        };
        assert_eq!(
            budget
                .check(&usage, 0, &Reservation::default(), Duration::ZERO)
                .map_err(|b| b.which),
            Err("cost"),
        );
    }

    #[test]
    fn openai_usage_with_cached_tokens() {
        let counts = TokenCounts::from_response(&json!({"usage": {
            "prompt_tokens": 1000, "completion_tokens": 200,
            "prompt_tokens_details": {"cached_tokens": 400}
        }}))
        .unwrap();
        assert_eq!(
            counts,
            TokenCounts {
                prompt: 1000,
                completion: 200,
                cached: 400
            }
        );
        // 600 uncached * 2 + 400 cached * 0.5 + 200 out * 8 = 1200 + 200 + 1600 = 3000 per 1e6.
        assert!((counts.cost_usd(&price()) - 0.003).abs() < 1e-12);
    }

    #[test]
    fn deepseek_cache_hits_count_as_cached() {
        let counts = TokenCounts::from_usage(&json!({
            "prompt_tokens": 50, "completion_tokens": 5, "prompt_cache_hit_tokens": 30
        }))
        .unwrap();
        assert_eq!(counts.cached, 30);
    }

    #[test]
    fn missing_or_null_usage_is_none() {
        assert_eq!(TokenCounts::from_response(&json!({"choices": []})), None);
        assert_eq!(TokenCounts::from_response(&json!({"usage": null})), None);
    }

    #[test]
    fn cached_beyond_prompt_is_clamped() {
        let counts = TokenCounts {
            prompt: 10,
            completion: 0,
            cached: 20,
        };
        assert!((counts.cost_usd(&price()) - 10.0 * 0.5 / 1e6).abs() < 1e-15);
        assert_eq!(counts.as_call_usage(&price()).tokens_cached, 10);
    }

    #[test]
    fn budgets_exhaust_at_their_limit() {
        let budget = TaskBudget {
            max_calls: Some(3),
            max_tokens: Some(100),
            max_cost_usd: Some(0.5),
            max_duration: Some(Duration::from_secs(10)),
        };
        let mut used = Usage {
            calls: 2,
            ..Usage::default()
        };
        assert!(
            budget
                .check(&used, 0, &Reservation::default(), Duration::ZERO)
                .is_ok()
        );
        let err = budget
            .check(&used, 1, &Reservation::default(), Duration::ZERO)
            .unwrap_err();
        assert_eq!(err.which, "calls");
        assert_eq!(
            err.message("t1"),
            "task t1: calls budget exhausted (used 3, limit 3)"
        );
        used.tokens_in = 60;
        used.tokens_out = 40;
        assert_eq!(
            budget
                .check(&used, 0, &Reservation::default(), Duration::ZERO)
                .unwrap_err()
                .which,
            "tokens"
        );
        used.tokens_in = 0;
        used.cost_usd = 0.5;
        assert_eq!(
            budget
                .check(&used, 0, &Reservation::default(), Duration::ZERO)
                .unwrap_err()
                .which,
            "cost"
        );
        used.cost_usd = 0.0;
        assert_eq!(
            budget
                .check(&used, 0, &Reservation::default(), Duration::from_secs(10))
                .unwrap_err()
                .which,
            "time"
        );
        assert!(
            TaskBudget::default()
                .check(&used, 99, &Reservation::default(), Duration::MAX)
                .is_ok()
        );
    }

    #[test]
    fn calls_in_flight_hold_their_worst_case_against_tokens_and_cost() {
        let request = json!({"messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "héllo"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ]},
        ]});
        let one = Reservation::of(&request, 100, &price());
        // 6 bytes of text, one message's template, one image, 100 out.
        let prompt = 6 + TEMPLATE_TOKENS_PER_MESSAGE + TOKENS_PER_IMAGE;
        assert_eq!(one.tokens, prompt + 100);
        assert!((one.cost_usd - (prompt as f64 * 2.0 + 100.0 * 8.0) / 1e6).abs() < 1e-12);
        let budget = TaskBudget {
            max_tokens: Some(2 * one.tokens),
            ..TaskBudget::default()
        };
        let used = Usage::default();
        let mut held = Reservation::default();
        // A call is admitted while the calls in flight leave room, whatever its own size.
        assert!(budget.check(&used, 0, &held, Duration::ZERO).is_ok());
        held.add(&one);
        assert!(budget.check(&used, 1, &held, Duration::ZERO).is_ok());
        held.add(&one);
        let refused = budget.check(&used, 2, &held, Duration::ZERO).unwrap_err();
        assert_eq!(refused.which, "tokens");
        assert!(refused.used.contains("in flight"), "{refused:?}");
        held.release(&one);
        held.release(&one);
        assert_eq!(held, Reservation::default());
    }

    #[test]
    fn a_request_gets_an_output_limit_no_higher_than_the_cap() {
        let mut none = json!({"messages": []}).as_object().unwrap().clone();
        assert_eq!(cap_output_tokens(&mut none, 500), 500);
        assert_eq!(none["max_tokens"], 500);
        let mut high = json!({"max_completion_tokens": 100000, "max_tokens": 50})
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(cap_output_tokens(&mut high, 500), 50);
        assert_eq!(high["max_completion_tokens"], 500);
        assert_eq!(high["max_tokens"], 50);
        // Not a number: the cap.
        let mut odd = json!({"max_tokens": "lots"}).as_object().unwrap().clone();
        assert_eq!(cap_output_tokens(&mut odd, 500), 500);
        assert_eq!(odd["max_tokens"], 500);
    }

    #[test]
    fn usage_adds_fieldwise() {
        let mut a = Usage {
            calls: 1,
            tokens_in: 10,
            cost_usd: 0.25,
            ..Usage::default()
        };
        a.add(&Usage {
            calls: 2,
            tokens_in: 5,
            cost_usd: 0.5,
            retries: 1,
            replay: true,
            ..Usage::default()
        });
        assert_eq!(a.calls, 3);
        assert_eq!(a.tokens_in, 15);
        assert_eq!(a.retries, 1);
        assert!(a.replay);
        assert!((a.cost_usd - 0.75).abs() < 1e-12);
    }
}
