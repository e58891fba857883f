//! Trees staged ahead. A caller that knows which execution comes next announces it
//! ([`crate::Sandbox::exec_ahead`]); once an execution's command is running, the announced
//! trees are staged (copied, patched and sealed) on threads of their own, and the execution of
//! an equal request takes its tree instead of staging it on its path. A tree staged ahead is
//! staged exactly as one staged on demand, from the same request; only its time differs.

use super::exec::{self, Context, StagedTree};
use crate::{ExecRequest, InputFile, PatchFile, SandboxError};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

use crate::stage_ahead::StageAheadMode;

/// At most this many trees are announced or staged ahead at once (the oldest goes first).
const MAX_AHEAD: usize = 4;
/// A tree announced or staged this long ago and not taken is discarded.
const AHEAD_IDLE: Duration = Duration::from_secs(60);

/// Everything a staged tree depends on: a tree staged ahead goes only to an execution whose
/// request gives an equal key.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StageKey {
    template: PathBuf,
    files: Vec<InputFile>,
    patches: Vec<PatchFile>,
    disk_mb: u64,
    max_output_bytes: usize,
}

impl StageKey {
    /// The key of an execution of `req` on the checkout `template`.
    pub(super) fn of(template: &std::path::Path, req: &ExecRequest) -> StageKey {
        StageKey {
            template: template.to_path_buf(),
            files: req.files.clone(),
            patches: req.patches.clone(),
            disk_mb: req.limits.disk_mb,
            max_output_bytes: req.limits.max_output_bytes,
        }
    }
}

/// A tree's staging result, sent by its thread.
type Staged = Result<StagedTree, SandboxError>;

enum State {
    /// Announced; staged once an execution's command runs.
    Announced(Box<(Context, ExecRequest)>),
    /// Being staged (or staged) on its thread.
    Staging(oneshot::Receiver<Staged>),
}

struct Entry {
    key: StageKey,
    since: Instant,
    /// Kills the staging when set (the tree is no longer wanted).
    cancel: Arc<AtomicBool>,
    state: State,
}

/// The trees announced or staged ahead on one sandbox.
pub(super) struct StageAhead {
    mode: StageAheadMode,
    entries: Mutex<Vec<Entry>>,
}

/// Sets its flag when dropped: a staging whose execution stopped waiting for it is killed.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl StageAhead {
    /// A pool that stages ahead as `mode` says (`Off`: it ignores announcements).
    pub(super) fn new(mode: StageAheadMode) -> StageAhead {
        StageAhead {
            mode,
            entries: Mutex::new(Vec::new()),
        }
    }

    /// Announces an execution of `req` in `ctx` (its template is part of its key); a request
    /// that fails validation is not announced.
    pub(super) fn announce(&self, ctx: Context, req: &ExecRequest) {
        // An invalid request is not staged: its execution meets the error on its path.
        if self.mode == StageAheadMode::Off || exec::validate(req).is_err() {
            return;
        }
        let key = StageKey::of(&ctx.template, req);
        let mut entries = crate::lock(&self.entries);
        discard_idle(&mut entries);
        if entries.iter().any(|e| e.key == key) {
            return;
        }
        if entries.len() >= MAX_AHEAD {
            discard(entries.remove(0));
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let ctx = Context {
            cancelled: cancel.clone(),
            ..ctx
        };
        entries.push(Entry {
            key,
            since: Instant::now(),
            cancel,
            state: State::Announced(Box::new((ctx, req.clone()))),
        });
    }

    /// Starts staging every announced tree (an execution's command has started: the stage's
    /// work no longer delays it).
    pub(super) fn start(&self) {
        if !crate::stage_ahead::stage_now(self.mode) {
            // Left announced: its execution stages its own tree.
            return;
        }
        let mut entries = crate::lock(&self.entries);
        for e in entries.iter_mut() {
            if !matches!(e.state, State::Announced(_)) {
                continue;
            }
            let (tx, rx) = oneshot::channel();
            let State::Announced(job) = std::mem::replace(&mut e.state, State::Staging(rx)) else {
                unreachable!("checked above");
            };
            std::thread::spawn(move || {
                let (ctx, req) = *job;
                // An unwanted tree comes back and is dropped (removed) here.
                let _ = tx.send(exec::stage_blocking(&ctx, &req));
            });
        }
    }

    /// The tree staged ahead for `key`, once staged; `None` when none was started for it (an
    /// announced one is dropped: the caller stages its own) or its staging failed (the caller
    /// stages again, and meets the error itself).
    pub(super) async fn take(&self, key: &StageKey) -> Option<StagedTree> {
        let entry = {
            let mut entries = crate::lock(&self.entries);
            discard_idle(&mut entries);
            let i = entries.iter().position(|e| &e.key == key)?;
            entries.remove(i)
        };
        let State::Staging(rx) = entry.state else {
            return None;
        };
        // Dropped with this future: a cancelled execution stops its staging too.
        let _cancel = CancelOnDrop(entry.cancel);
        rx.await.ok()?.ok()
    }

    /// Kills and removes every tree announced or staged ahead, and waits until they are gone.
    pub(super) async fn settle(&self) {
        let entries = std::mem::take(&mut *crate::lock(&self.entries));
        for e in entries {
            e.cancel.store(true, Ordering::Relaxed);
            if let State::Staging(rx) = e.state
                && let Ok(Ok(tree)) = rx.await
            {
                let _ = tokio::task::spawn_blocking(move || drop(tree)).await;
            }
        }
    }

    /// How many trees are announced or staged ahead.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        crate::lock(&self.entries).len()
    }
}

/// Discards the entries not taken within [`AHEAD_IDLE`].
fn discard_idle(entries: &mut Vec<Entry>) {
    let (idle, kept): (Vec<Entry>, Vec<Entry>) = std::mem::take(entries)
        .into_iter()
        .partition(|e| e.since.elapsed() > AHEAD_IDLE);
    *entries = kept;
    idle.into_iter().for_each(discard);
}

/// Kills an entry's staging and removes its tree, off the caller's path.
fn discard(e: Entry) {
    e.cancel.store(true, Ordering::Relaxed);
    if let State::Staging(rx) = e.state {
        std::thread::spawn(move || drop(rx.blocking_recv()));
    }
}
