//! Cache counters of the streamed layers: hits and misses, bytes and time
//! read, time blocked on reads, the lookahead's precision, and the I/O floor
//! of a phase.

use std::time::{Duration, Instant};

/// Cache counters of one layer (or summed over layers).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CacheStats {
    /// Distinct (batch, expert) uses served from a slot.
    pub hits: u64,
    /// Distinct (batch, expert) uses that needed a read.
    pub misses: u64,
    pub bytes_read: u64,
    /// Time the sync point waited for reads (not hidden behind compute).
    pub io_time: Duration,
    /// Time from the first demand read of a wave to its last.
    pub read_time: Duration,
    /// Experts computed while reads of their wave were still in flight.
    pub overlapped: u64,
    pub waves: u64,
    /// Batches that needed more than one wave.
    pub multi_wave_batches: u64,
    /// Experts the lookaheads toward this layer guessed (its router's
    /// picks from the layer before, cached or not).
    pub guessed: u64,
    /// Experts read speculatively (lookahead prefetch) in full, and every
    /// byte the lookahead read (with experts whose reads it dropped).
    pub prefetched: u64,
    pub prefetch_bytes: u64,
    /// Of `prefetch_bytes`, those whose reads a batch took over while they
    /// were in flight ([`super::StreamedLayer::plan_adopting`]): read
    /// within the batch's `read_time`.
    pub adopted_bytes: u64,
    /// Prefetched experts the next batch used.
    pub prefetch_used: u64,
    /// Experts the batches after a prefetch needed that were not cached
    /// before it (what a perfect prefetch would have read).
    pub prefetch_wanted: u64,
    /// Slices read through io_uring (`--longhaul-io uring`); the rest of
    /// `bytes_read` went through the I/O threads' positional reads.
    pub uring_reads: u64,
}

impl CacheStats {
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }

    /// Bytes read within `read_time`: the demand reads' and those of a
    /// lookahead's reads that a batch took over in flight.
    fn windowed_bytes(&self) -> u64 {
        self.bytes_read.saturating_sub(self.prefetch_bytes) + self.adopted_bytes
    }

    /// Bytes per second while demand reads were in flight (the lookahead's
    /// reads overlap compute, so their time is not measured apart, except
    /// where a batch waits for them).
    pub fn read_throughput(&self) -> f64 {
        self.windowed_bytes() as f64 / self.read_time.as_secs_f64().max(1e-9)
    }

    /// Time to read every byte read, demand and lookahead, at the demand
    /// reads' throughput: a lookahead that reads the wrong experts costs
    /// the disk's time too.
    pub fn reads_time(&self) -> Duration {
        let demand = self.windowed_bytes();
        if demand == 0 {
            return self.read_time;
        }
        self.read_time
            .mul_f64(self.bytes_read as f64 / demand as f64)
    }

    /// Share of prefetched experts that were used.
    pub fn prefetch_precision(&self) -> f64 {
        self.prefetch_used as f64 / self.prefetched.max(1) as f64
    }

    /// Share of would-be misses that a prefetch covered.
    pub fn prefetch_recall(&self) -> f64 {
        self.prefetch_used as f64 / self.prefetch_wanted.max(1) as f64
    }

    /// The counters accumulated since `earlier` (a snapshot of the same
    /// layers): the cost of one phase, such as a prompt or its decode.
    pub fn since(&self, earlier: &CacheStats) -> CacheStats {
        CacheStats {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
            io_time: self.io_time.saturating_sub(earlier.io_time),
            read_time: self.read_time.saturating_sub(earlier.read_time),
            overlapped: self.overlapped.saturating_sub(earlier.overlapped),
            waves: self.waves.saturating_sub(earlier.waves),
            multi_wave_batches: self
                .multi_wave_batches
                .saturating_sub(earlier.multi_wave_batches),
            guessed: self.guessed.saturating_sub(earlier.guessed),
            prefetched: self.prefetched.saturating_sub(earlier.prefetched),
            prefetch_bytes: self.prefetch_bytes.saturating_sub(earlier.prefetch_bytes),
            adopted_bytes: self.adopted_bytes.saturating_sub(earlier.adopted_bytes),
            prefetch_used: self.prefetch_used.saturating_sub(earlier.prefetch_used),
            prefetch_wanted: self.prefetch_wanted.saturating_sub(earlier.prefetch_wanted),
            uring_reads: self.uring_reads.saturating_sub(earlier.uring_reads),
        }
    }

    /// The I/O floor of a phase that produced `tokens` in `wall` time with
    /// these counters, taken as one step (see [`steps_floor_tps`]): tokens
    /// per second if it cost only the larger of its read time
    /// ([`CacheStats::reads_time`]) and its compute time (the wall time less
    /// the time blocked on reads), i.e. with reads and compute fully
    /// overlapped.
    pub fn io_floor_tps(&self, tokens: usize, wall: Duration) -> f64 {
        steps_floor_tps(&[StepCost { wall, io: *self }], tokens)
    }

    pub fn add(&mut self, o: &CacheStats) {
        self.guessed += o.guessed;
        self.prefetched += o.prefetched;
        self.prefetch_bytes += o.prefetch_bytes;
        self.adopted_bytes += o.adopted_bytes;
        self.prefetch_used += o.prefetch_used;
        self.prefetch_wanted += o.prefetch_wanted;
        self.hits += o.hits;
        self.misses += o.misses;
        self.bytes_read += o.bytes_read;
        self.io_time += o.io_time;
        self.read_time += o.read_time;
        self.overlapped += o.overlapped;
        self.waves += o.waves;
        self.multi_wave_batches += o.multi_wave_batches;
        self.uring_reads += o.uring_reads;
    }
}

/// One forward pass of a phase: its wall time (from the end of the pass
/// before, so that a phase's steps cover its whole time) and its counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCost {
    pub wall: Duration,
    pub io: CacheStats,
}

/// Records a phase's steps from the layers' counters summed
/// ([`crate::engine::Engine::longhaul_stats`]; `None` resident): each
/// step's wall time runs from the end of the one before, the first's from
/// [`StepClock::start`].
#[derive(Debug, Default)]
pub struct StepClock {
    last: Option<(Instant, CacheStats)>,
    steps: Vec<StepCost>,
}

impl StepClock {
    pub fn start(counters: Option<CacheStats>) -> Self {
        StepClock {
            last: counters.map(|c| (Instant::now(), c)),
            steps: Vec::new(),
        }
    }

    /// A step has ended; `counters` are the layers' now.
    pub fn step(&mut self, counters: Option<CacheStats>) {
        let (Some((t, before)), Some(now)) = (self.last, counters) else {
            return;
        };
        let end = Instant::now();
        self.steps.push(StepCost {
            wall: end - t,
            io: now.since(&before),
        });
        self.last = Some((end, now));
    }

    /// The steps recorded (`None` resident).
    pub fn steps(self) -> Option<Vec<StepCost>> {
        self.last.map(|_| self.steps)
    }
}

/// The counters of a phase's steps, summed.
pub fn steps_total(steps: &[StepCost]) -> CacheStats {
    let mut t = CacheStats::default();
    for s in steps {
        t.add(&s.io);
    }
    t
}

/// The I/O floor of a phase of `steps` that produced `tokens`: tokens per
/// second if each step cost only the larger of its compute time (its wall
/// time less the time it blocked on reads) and its read time (its bytes at
/// the phase's read throughput, as [`CacheStats::reads_time`] counts them,
/// and at most its wall time: its bytes were all read within it).
///
/// Per step, not over the phase's sums: steps run one after another (a
/// decode step routes on the token the one before produced) and no read
/// spans two of them (a lookahead reads for the next layer of the same
/// pass), so a step's reads overlap only its own compute. A decode that
/// starts on a cold cache is bound by its reads for its first steps and by
/// compute after; the larger of the phase's two sums would count those
/// first steps' compute as hiding reads it never overlapped.
pub fn steps_floor_tps(steps: &[StepCost], tokens: usize) -> f64 {
    let all = steps_total(steps);
    let demand = all.windowed_bytes();
    let floor: f64 = steps
        .iter()
        .map(|s| {
            let compute = s.wall.saturating_sub(s.io.io_time);
            let reads = if demand == 0 {
                s.io.read_time
            } else {
                all.read_time
                    .mul_f64(s.io.bytes_read as f64 / demand as f64)
            };
            compute.max(reads.min(s.wall)).as_secs_f64()
        })
        .sum();
    tokens as f64 / floor.max(1e-9)
}

#[cfg(test)]
mod stats_tests {
    use super::*;

    #[test]
    fn a_phase_is_the_difference_of_two_snapshots() {
        let prompt = CacheStats {
            hits: 3,
            misses: 5,
            bytes_read: 500,
            io_time: Duration::from_millis(40),
            read_time: Duration::from_millis(70),
            overlapped: 2,
            waves: 4,
            guessed: 9,
            uring_reads: 6,
            ..CacheStats::default()
        };
        let decode = CacheStats {
            hits: 7,
            misses: 1,
            bytes_read: 100,
            io_time: Duration::from_millis(5),
            read_time: Duration::from_millis(9),
            overlapped: 1,
            waves: 8,
            ..CacheStats::default()
        };
        let mut total = prompt;
        total.add(&decode);
        assert_eq!(total.since(&prompt), decode);
        assert_eq!(total.since(&total), CacheStats::default());
    }

    #[test]
    fn the_io_floor_takes_the_larger_of_reads_and_compute() {
        let s = |io, read| CacheStats {
            io_time: Duration::from_secs(io),
            read_time: Duration::from_secs(read),
            ..CacheStats::default()
        };
        let wall = Duration::from_secs(10);
        // Compute 10 - 4 = 6 s beats 5 s of reads: 12 tokens / 6 s.
        assert_eq!(s(4, 5).io_floor_tps(12, wall), 2.0);
        // 8 s of reads beat 6 s of compute.
        assert_eq!(s(4, 8).io_floor_tps(12, wall), 1.5);
        // A lookahead's bytes cost the disk's time at the demand reads'
        // throughput: 300 bytes in 4 s of demand reads, 100 more read ahead,
        // is 5.33 s of reads, which beats 10 - 5 = 5 s of compute.
        let ahead = CacheStats {
            io_time: Duration::from_secs(5),
            read_time: Duration::from_secs(4),
            bytes_read: 400,
            prefetch_bytes: 100,
            ..CacheStats::default()
        };
        assert_eq!(ahead.read_throughput(), 75.0);
        assert!((ahead.reads_time().as_secs_f64() - 16.0 / 3.0).abs() < 1e-9);
        assert!((ahead.io_floor_tps(16, wall) - 3.0).abs() < 1e-9);
        // Of those 100, 60 were taken over by a batch in flight and landed
        // within its 4 s: 360 bytes in 4 s, so 400 bytes take 4.44 s.
        let adopted = CacheStats {
            adopted_bytes: 60,
            ..ahead
        };
        assert_eq!(adopted.read_throughput(), 90.0);
        assert!((adopted.reads_time().as_secs_f64() - 40.0 / 9.0).abs() < 1e-9);
        // All reads ahead, none on demand: the demand read time as it is.
        let all_ahead = CacheStats {
            bytes_read: 100,
            prefetch_bytes: 100,
            ..s(0, 0)
        };
        assert_eq!(all_ahead.reads_time(), Duration::ZERO);
    }

    #[test]
    fn the_io_floor_of_steps_takes_the_larger_of_reads_and_compute_in_each() {
        let step = |wall, io, read, bytes| StepCost {
            wall: Duration::from_secs(wall),
            io: CacheStats {
                io_time: Duration::from_secs(io),
                read_time: Duration::from_secs(read),
                bytes_read: bytes,
                ..CacheStats::default()
            },
        };
        // A cold step: 600 bytes, 6 s of reads blocking 5 of its 8 s; then
        // two warm ones: 100 bytes each, 1 s of reads hidden behind 4 s of
        // compute. The phase reads 800 bytes in 8 s of demand reads.
        let cold = step(8, 5, 6, 600);
        let warm = step(4, 0, 1, 100);
        let steps = [cold, warm, warm];
        // Per step: max(3, 6) + max(4, 1) + max(4, 1) = 14 s for 3 tokens.
        assert!((steps_floor_tps(&steps, 3) - 3.0 / 14.0).abs() < 1e-12);
        // Over the phase's sums, 16 - 5 = 11 s of compute beats 8 s of
        // reads: the cold step's reads would hide behind compute that came
        // after them.
        let all = steps_total(&steps);
        assert_eq!(all.bytes_read, 800);
        let wall = Duration::from_secs(16);
        assert!((all.io_floor_tps(3, wall) - 3.0 / 11.0).abs() < 1e-12);
        // One step is the phase's sums.
        assert_eq!(
            steps_floor_tps(&[cold], 1),
            cold.io.io_floor_tps(1, cold.wall)
        );
        // A step's reads never count for more than its wall time: 700 of the
        // phase's 800 bytes in a 2 s step (at the phase's throughput, 100
        // bytes a second, 7 s) cost at most those 2 s; the other step's
        // 8 s of compute beat its 1 s of reads.
        let fast = step(2, 0, 0, 700);
        let slow = step(9, 1, 8, 100);
        assert!((steps_floor_tps(&[fast, slow], 2) - 2.0 / 10.0).abs() < 1e-12);
    }
}
