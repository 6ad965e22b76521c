//! Slot state on disk: the `/slots` save and restore actions,
//! `--slot-persist` (every slot saved on a clean shutdown and restored at
//! start) and the context cache (`--context-cache-path`: finished
//! conversations spilled to files and taken back by a later request with
//! the same prefix). All of it runs on the engine thread, between steps.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{common_prefix, SlotAction, SlotError, SlotReply, Worker};
use crate::backend::Backend;

/// A conversation in the context cache directory.
struct CacheEntry {
    path: PathBuf,
    tokens: Vec<u32>,
    /// Larger: used more recently.
    used: u64,
}

/// `--context-cache-path` / `--context-cache-slots`.
pub(super) struct ContextCache {
    dir: PathBuf,
    max: usize,
    entries: Vec<CacheEntry>,
    clock: u64,
}

/// The file the persistent slot `i` is kept in.
fn persist_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("longhaul-slot-{i}.state"))
}

/// FNV-1a 64 of a token list: the context cache's file names.
fn tokens_hash(t: &[u32]) -> u64 {
    t.iter()
        .flat_map(|x| x.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

impl<B: Backend + 'static> Worker<B> {
    /// Runs the slot actions whose slots are idle; the others wait.
    pub(super) fn run_slot_jobs(&mut self) {
        let jobs = std::mem::take(&mut self.slot_jobs);
        for job in jobs {
            if self.slots.get(job.id).is_some_and(|s| s.active.is_some()) {
                self.slot_jobs.push_back(job);
                continue;
            }
            let r = self.slot_action(job.id, job.action);
            self.publish();
            let _ = job.reply.send(r);
        }
    }

    fn slot_action(&mut self, id: usize, action: SlotAction) -> Result<SlotReply, SlotError> {
        let n_slots = self.slots.len();
        if id >= n_slots {
            return Err(SlotError::NoSlot { id, n_slots });
        }
        let t0 = Instant::now();
        let ms = || t0.elapsed().as_secs_f64() * 1e3;
        match action {
            SlotAction::Save(path) => {
                let n_written = self.save_slot(id, &path).map_err(SlotError::File)?;
                Ok(SlotReply::Saved {
                    n_saved: self.slots[id].cached.len(),
                    n_written,
                    ms: ms(),
                })
            }
            SlotAction::Restore(path) => {
                let (n_restored, n_read) = self.restore_slot(id, &path).map_err(SlotError::File)?;
                Ok(SlotReply::Restored {
                    n_restored,
                    n_read,
                    ms: ms(),
                })
            }
            SlotAction::Erase => {
                let s = &mut self.slots[id];
                let n_erased = s.cached.len();
                let _ = s.kv.reset(&self.engine.model.backend);
                s.cached.clear();
                s.restored = 0;
                Ok(SlotReply::Erased { n_erased })
            }
        }
    }

    /// Writes slot `i`'s state to `path`; returns the bytes written.
    fn save_slot(&mut self, i: usize, path: &Path) -> Result<u64, String> {
        let s = &mut self.slots[i];
        // The tokens the state holds (a finished request's last token was
        // sampled, not evaluated).
        s.cached.truncate(s.kv.n_past());
        let t0 = Instant::now();
        let r = self.engine.save_state(&s.kv, &s.cached, path);
        match r {
            Ok(n) => {
                eprintln!(
                    "longhaul: saved slot {i} ({} tokens, {}) to {} in {:.0} ms",
                    s.cached.len(),
                    crate::mem::human_bytes(n),
                    path.display(),
                    t0.elapsed().as_secs_f64() * 1e3
                );
                let mut m = self.metrics();
                m.state_saves += 1;
                m.state_bytes_written += n;
                Ok(n)
            }
            Err(e) => Err(format!("cannot save slot {i} to {}: {e}", path.display())),
        }
    }

    /// Replaces slot `i`'s state with the file at `path`; returns its
    /// tokens and bytes. A refused file leaves the slot as it was.
    fn restore_slot(&mut self, i: usize, path: &Path) -> Result<(usize, u64), String> {
        let t0 = Instant::now();
        let s = &mut self.slots[i];
        match self.engine.restore_state(&mut s.kv, path) {
            Ok((tokens, n)) => {
                s.cached = tokens;
                s.restored = s.cached.len();
                eprintln!(
                    "longhaul: restored slot {i} ({} tokens, {}) from {} in {:.0} ms",
                    s.cached.len(),
                    crate::mem::human_bytes(n),
                    path.display(),
                    t0.elapsed().as_secs_f64() * 1e3
                );
                let n_tok = s.cached.len();
                let mut m = self.metrics();
                m.state_restores += 1;
                m.state_bytes_read += n;
                Ok((n_tok, n))
            }
            Err(e) => {
                // A write that failed part-way left the state empty.
                if s.kv.n_past() == 0 {
                    s.cached.clear();
                    s.restored = 0;
                }
                Err(format!(
                    "cannot restore slot {i} from {}: {e}",
                    path.display()
                ))
            }
        }
    }

    /// Where `--slot-persist` keeps the slots, when it is on.
    fn persist_dir(&self) -> Option<PathBuf> {
        let s = &self.states;
        s.slot_save_path.clone().filter(|_| s.persist)
    }

    /// `--slot-persist` at start-up: each slot's saved state, if any.
    pub(super) fn restore_persisted(&mut self) {
        let Some(dir) = self.persist_dir() else {
            return;
        };
        for i in 0..self.slots.len() {
            let p = persist_path(&dir, i);
            if p.exists() {
                if let Err(e) = self.restore_slot(i, &p) {
                    eprintln!("longhaul: slot {i} starts empty: {e}");
                }
            }
        }
    }

    /// `--slot-persist` at shutdown: every slot holding a state is saved
    /// (one holding none removes its old file, which no longer says what
    /// the slot held).
    pub(super) fn persist(&mut self) {
        let Some(dir) = self.persist_dir() else {
            return;
        };
        for i in 0..self.slots.len() {
            let p = persist_path(&dir, i);
            if self.slots[i].kv.n_past() == 0 {
                let _ = std::fs::remove_file(&p);
                continue;
            }
            if let Err(e) = self.save_slot(i, &p) {
                eprintln!("longhaul: {e}");
            }
        }
    }

    /// Reads the context cache directory: the conversations saved there
    /// for this model and settings, least recently used first.
    pub(super) fn open_cache(&mut self) {
        let Some(dir) = self.states.context_cache.clone() else {
            return;
        };
        let max = self.states.context_cache_slots.max(1);
        let mut entries = Vec::new();
        if let (Ok(rd), Some(slot)) = (std::fs::read_dir(&dir), self.slots.first()) {
            let mut found: Vec<(std::time::SystemTime, PathBuf, Vec<u32>)> = Vec::new();
            for e in rd.flatten() {
                let path = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if !(name.starts_with("ctx-") && name.ends_with(".state")) {
                    continue;
                }
                // Files of other models or settings stay, unused.
                if let Ok(tokens) = self.engine.state_tokens(&slot.kv, &path) {
                    let t = e
                        .metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::UNIX_EPOCH);
                    found.push((t, path, tokens));
                }
            }
            found.sort_by_key(|f| f.0);
            entries = found
                .into_iter()
                .enumerate()
                .map(|(i, (_, path, tokens))| CacheEntry {
                    path,
                    tokens,
                    used: i as u64,
                })
                .collect();
        }
        let clock = entries.len() as u64;
        self.cache = Some(ContextCache {
            dir,
            max,
            entries,
            clock,
        });
        self.evict();
    }

    /// Removes the least recently used conversations beyond the limit.
    fn evict(&mut self) {
        let Some(c) = self.cache.as_mut() else { return };
        while c.entries.len() > c.max {
            let Some(i) = (0..c.entries.len()).min_by_key(|&i| c.entries[i].used) else {
                break;
            };
            let e = c.entries.remove(i);
            let _ = std::fs::remove_file(&e.path);
        }
    }

    /// Writes slot `i`'s conversation to the context cache (unless it is
    /// there already).
    pub(super) fn spill(&mut self, i: usize) {
        let n = self.slots[i].kv.n_past();
        self.slots[i].cached.truncate(n);
        let Some(c) = self.cache.as_mut() else { return };
        if n == 0 {
            return;
        }
        c.clock += 1;
        let now = c.clock;
        if let Some(e) = c
            .entries
            .iter_mut()
            .find(|e| e.tokens == self.slots[i].cached)
        {
            e.used = now;
            return;
        }
        let path = c.dir.join(format!(
            "ctx-{:016x}.state",
            tokens_hash(&self.slots[i].cached)
        ));
        c.entries.retain(|e| e.path != path);
        match self.save_slot(i, &path) {
            Ok(_) => {
                if let Some(c) = self.cache.as_mut() {
                    c.entries.push(CacheEntry {
                        path,
                        tokens: self.slots[i].cached.clone(),
                        used: now,
                    });
                }
                self.evict();
            }
            Err(e) => eprintln!("longhaul: context cache: {e}"),
        }
    }

    /// Before slot `i` takes `prompt`: writes the slot's conversation to the
    /// context cache when `prompt` would drop most of it, and restores a
    /// cached conversation that shares more of `prompt` than the slot does.
    pub(super) fn use_cache(&mut self, i: usize, prompt: &[u32]) {
        if self.cache.is_none() {
            return;
        }
        let recurrent = self.slots[i].kv.is_recurrent();
        let held = common_prefix(&self.slots[i].cached, prompt);
        // What a cached conversation gives: its common prefix with the
        // prompt (a recurrent state only its whole length, as it cannot go
        // back inside it).
        let usable = |t: &[u32]| {
            let n = common_prefix(t, prompt);
            if recurrent && n < t.len() {
                0
            } else {
                n
            }
        };
        let best = self.cache.as_ref().and_then(|c| {
            (0..c.entries.len())
                .map(|k| (k, usable(&c.entries[k].tokens)))
                .filter(|&(_, n)| n > held)
                .max_by_key(|&(_, n)| n)
        });
        // Marked used first, so that the spill cannot evict it.
        let chosen = best.and_then(|(k, _)| {
            let c = self.cache.as_mut()?;
            c.clock += 1;
            c.entries[k].used = c.clock;
            Some(c.entries[k].tokens.clone())
        });
        // As llama-server's prompt cache does: a conversation is kept when
        // the new prompt would keep less than half of it (a conversation
        // that goes on keeps nearly all of it, and replaces it).
        let loses = held * 2 < self.slots[i].cached.len().min(self.slots[i].kv.n_past());
        if loses || chosen.is_some() {
            self.spill(i);
        }
        let Some(tokens) = chosen else { return };
        let Some((k, path)) = self.cache.as_ref().and_then(|c| {
            let k = c.entries.iter().position(|e| e.tokens == tokens)?;
            Some((k, c.entries[k].path.clone()))
        }) else {
            return;
        };
        if let Err(e) = self.restore_slot(i, &path) {
            eprintln!("longhaul: context cache: {e}; the prompt is evaluated instead");
            if let Some(c) = self.cache.as_mut() {
                let e = c.entries.remove(k);
                let _ = std::fs::remove_file(&e.path);
            }
        }
    }
}
