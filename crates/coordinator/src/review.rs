//! Human review of non-crash Android results, the LTGDroid protocol: two reviewers examine each
//! result independently; when they disagree a third one decides. Pure: the state of an item and
//! its final verdict follow from its reviews in the order they were given.

use serde::Serialize;

/// A reviewer's verdict on one result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HumanVerdict {
    /// The trace reproduces the reported bug.
    Reproduced,
    /// It does not.
    NotReproduced,
}

impl HumanVerdict {
    /// The verdict string of the results schema (`reproduced` / `not_reproduced`).
    pub fn as_str(self) -> &'static str {
        match self {
            HumanVerdict::Reproduced => "reproduced",
            HumanVerdict::NotReproduced => "not_reproduced",
        }
    }

    /// The `success` column this verdict stands for.
    pub fn success(self) -> bool {
        self == HumanVerdict::Reproduced
    }

    /// Reads `reproduced`, `not-reproduced` or `not_reproduced`.
    pub fn parse(s: &str) -> Option<HumanVerdict> {
        match s {
            "reproduced" => Some(HumanVerdict::Reproduced),
            "not_reproduced" | "not-reproduced" => Some(HumanVerdict::NotReproduced),
            _ => None,
        }
    }
}

impl std::fmt::Display for HumanVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an item is in the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewState {
    /// Fewer than two reviews.
    Pending,
    /// The first two reviewers agree: their verdict is final.
    Agreed,
    /// The first two reviewers disagree: a third reviewer is needed.
    Tie,
    /// The third reviewer decided.
    Decided,
}

impl ReviewState {
    /// Lower-case name, as `review list` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewState::Pending => "pending",
            ReviewState::Agreed => "agreed",
            ReviewState::Tie => "tie",
            ReviewState::Decided => "decided",
        }
    }
}

/// One review as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Review {
    /// Who reviewed.
    pub reviewer: String,
    /// What they decided.
    pub verdict: HumanVerdict,
    /// Free text.
    pub note: Option<String>,
}

/// The state of an item from its reviews (in submission order).
pub fn review_state(reviews: &[HumanVerdict]) -> ReviewState {
    match reviews {
        [] | [_] => ReviewState::Pending,
        [a, b] if a == b => ReviewState::Agreed,
        [_, _] => ReviewState::Tie,
        [a, b, ..] if a == b => ReviewState::Agreed,
        _ => ReviewState::Decided,
    }
}

/// The final verdict: the agreement of the first two, or the third reviewer's; None while open.
pub fn final_verdict(reviews: &[HumanVerdict]) -> Option<HumanVerdict> {
    match review_state(reviews) {
        ReviewState::Agreed => Some(reviews[0]),
        ReviewState::Decided => Some(reviews[2]),
        ReviewState::Pending | ReviewState::Tie => None,
    }
}

/// Why a review is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Each reviewer reviews an item once; reviews are final.
    #[error(
        "reviewer `{reviewer}` already reviewed this item ({verdict}); each reviewer reviews an item once and reviews are final, so another reviewer must give the next verdict"
    )]
    AlreadyReviewed {
        /// The reviewer.
        reviewer: String,
        /// Their recorded verdict.
        verdict: HumanVerdict,
    },
    /// The first two reviewers agree: a third review is not needed.
    #[error(
        "this item is already agreed ({0}): its first two reviewers agree, and a third review is accepted only when they disagree"
    )]
    AlreadyAgreed(HumanVerdict),
    /// The third reviewer has decided.
    #[error("this item is already decided ({0}) by its third reviewer; the protocol ends there")]
    AlreadyDecided(HumanVerdict),
}

/// Checks whether `reviewer` may add a review to an item with these reviews.
pub fn check_submit(reviews: &[Review], reviewer: &str) -> Result<(), Refusal> {
    if let Some(r) = reviews.iter().find(|r| r.reviewer == reviewer) {
        return Err(Refusal::AlreadyReviewed {
            reviewer: reviewer.to_string(),
            verdict: r.verdict,
        });
    }
    let verdicts: Vec<HumanVerdict> = reviews.iter().map(|r| r.verdict).collect();
    match (review_state(&verdicts), final_verdict(&verdicts)) {
        (ReviewState::Agreed, Some(v)) => Err(Refusal::AlreadyAgreed(v)),
        (ReviewState::Decided, Some(v)) => Err(Refusal::AlreadyDecided(v)),
        _ => Ok(()),
    }
}

/// Counts of a queue per state, and the verdicts review changed.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueCounts {
    /// Items in the queue.
    pub items: usize,
    /// Fewer than two reviews.
    pub pending: usize,
    /// Two reviewers agree.
    pub agreed: usize,
    /// Two reviewers disagree.
    pub tie: usize,
    /// A third reviewer decided.
    pub decided: usize,
    /// Final verdicts that differ from the automatic ones.
    pub changed: usize,
    /// Of those, automatic not reproduced → reviewed reproduced.
    pub changed_to_reproduced: usize,
    /// Of those, automatic reproduced → reviewed not reproduced.
    pub changed_to_not_reproduced: usize,
}

/// Counts the items of a queue per state and the changed verdicts.
pub fn count(items: &[crate::store::ReviewItem]) -> QueueCounts {
    let mut c = QueueCounts {
        items: items.len(),
        ..Default::default()
    };
    for i in items {
        match i.state {
            ReviewState::Pending => c.pending += 1,
            ReviewState::Agreed => c.agreed += 1,
            ReviewState::Tie => c.tie += 1,
            ReviewState::Decided => c.decided += 1,
        }
        if i.changed() {
            c.changed += 1;
            if i.auto_success {
                c.changed_to_not_reproduced += 1;
            } else {
                c.changed_to_reproduced += 1;
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::HumanVerdict::{NotReproduced as N, Reproduced as R};
    use super::*;

    fn review(who: &str, verdict: HumanVerdict) -> Review {
        Review {
            reviewer: who.into(),
            verdict,
            note: None,
        }
    }

    #[test]
    fn states_and_final_verdicts() {
        assert_eq!(review_state(&[]), ReviewState::Pending);
        assert_eq!(review_state(&[R]), ReviewState::Pending);
        assert_eq!(final_verdict(&[R]), None);
        assert_eq!(review_state(&[N, N]), ReviewState::Agreed);
        assert_eq!(final_verdict(&[N, N]), Some(N));
        assert_eq!(review_state(&[R, N]), ReviewState::Tie);
        assert_eq!(final_verdict(&[R, N]), None);
        assert_eq!(review_state(&[R, N, N]), ReviewState::Decided);
        assert_eq!(final_verdict(&[R, N, N]), Some(N));
        assert_eq!(final_verdict(&[N, R, R]), Some(R));
        // A third review after agreement is never accepted; if present, agreement still rules.
        assert_eq!(final_verdict(&[R, R, N]), Some(R));
    }

    #[test]
    fn who_may_review() {
        assert_eq!(check_submit(&[], "ann"), Ok(()));
        let one = [review("ann", R)];
        assert_eq!(check_submit(&one, "bob"), Ok(()));
        assert_eq!(
            check_submit(&one, "ann"),
            Err(Refusal::AlreadyReviewed {
                reviewer: "ann".into(),
                verdict: R
            })
        );
        let agreed = [review("ann", R), review("bob", R)];
        assert_eq!(check_submit(&agreed, "cat"), Err(Refusal::AlreadyAgreed(R)));
        let tie = [review("ann", R), review("bob", N)];
        assert_eq!(check_submit(&tie, "cat"), Ok(()));
        assert!(matches!(
            check_submit(&tie, "bob"),
            Err(Refusal::AlreadyReviewed { .. })
        ));
        let decided = [review("ann", R), review("bob", N), review("cat", N)];
        assert_eq!(
            check_submit(&decided, "dan"),
            Err(Refusal::AlreadyDecided(N))
        );
        assert!(
            Refusal::AlreadyAgreed(R)
                .to_string()
                .contains("already agreed")
        );
    }

    #[test]
    fn verdict_names() {
        assert_eq!(HumanVerdict::parse("not-reproduced"), Some(N));
        assert_eq!(HumanVerdict::parse("not_reproduced"), Some(N));
        assert_eq!(HumanVerdict::parse("reproduced"), Some(R));
        assert_eq!(HumanVerdict::parse("maybe"), None);
        assert_eq!(N.as_str(), "not_reproduced");
        assert!(R.success() && !N.success());
    }

    fn item(auto: bool, state: ReviewState, fin: Option<HumanVerdict>) -> crate::store::ReviewItem {
        crate::store::ReviewItem {
            task_id: 1,
            instance_id: "i".into(),
            agent: "a".into(),
            variant: "full".into(),
            backbone: "none".into(),
            repeat: 0,
            auto_success: auto,
            auto_verdict: String::new(),
            success: auto,
            verdict: String::new(),
            artifact_path: String::new(),
            state,
            final_verdict: fin,
            reviews: vec![],
        }
    }

    #[test]
    fn counts_states_and_changes() {
        use HumanVerdict::*;
        let items = [
            item(false, ReviewState::Pending, None),
            item(false, ReviewState::Agreed, Some(Reproduced)),
            item(true, ReviewState::Decided, Some(NotReproduced)),
            item(true, ReviewState::Agreed, Some(Reproduced)),
            item(true, ReviewState::Tie, None),
        ];
        let c = count(&items);
        assert_eq!(
            c,
            QueueCounts {
                items: 5,
                pending: 1,
                agreed: 2,
                tie: 1,
                decided: 1,
                changed: 2,
                changed_to_reproduced: 1,
                changed_to_not_reproduced: 1,
            }
        );
    }
}
