//! Whether decode steps read ahead (`--longhaul-prefetch on|off|auto`).
//!
//! The lookahead reads the experts the next MoE layer's router picks from
//! this layer's input while this layer computes. It pays where the disk
//! makes the sync point wait: its right guesses are reads no decode step
//! waits for. It costs where reads are cheap: its wrong guesses are read
//! and converted for nothing, on the cores the compute needs. On the
//! Qwen3-30B-A3B-shaped preset with two cores, it was 2-10% faster reading
//! from a virtio disk and 4-7% slower reading from tmpfs, with the same
//! binary. `auto` measures both on the machine at hand: after [`WARMUP`]
//! single-token passes that are not counted (the first decode steps fill
//! a cold cache; they read ahead, since there every expert is a miss, and
//! guesses read while the layer before computes are reads the step would
//! otherwise wait for), passes run in blocks with and
//! without it, in the order off-on-on-off-off-on-on-off (a drift that is
//! linear in time weighs on both alike), and the faster mean decides the
//! next [`EXPLOIT`] passes, after which it measures again. Where one arm
//! is faster by more than [`CLEAR`] after the order's first half (itself
//! balanced), that half decides.

use std::time::Duration;

/// `--longhaul-prefetch`; `auto` is the command line's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lookahead {
    Off,
    On,
    /// Measured while decoding ([`AutoLookahead`]).
    #[default]
    Auto,
}

impl std::str::FromStr for Lookahead {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on" | "1" | "true" => Ok(Self::On),
            "off" | "0" | "false" => Ok(Self::Off),
            "auto" => Ok(Self::Auto),
            _ => Err(format!(
                "`{s}` is not a --longhaul-prefetch value; use on, off or auto"
            )),
        }
    }
}

/// A plain switch: always or never.
impl From<bool> for Lookahead {
    fn from(on: bool) -> Self {
        if on {
            Self::On
        } else {
            Self::Off
        }
    }
}

/// Single-token passes before a measurement that are not counted.
pub const WARMUP: u32 = 8;
/// Single-token passes in a block of one arm.
pub const BLOCK: u32 = 4;
/// The arms of a measurement's blocks, `true` reading ahead.
pub const ORDER: [bool; 8] = [false, true, true, false, false, true, true, false];
/// Single-token passes that run the chosen arm before it is measured again.
pub const EXPLOIT: u32 = 256;
/// How much faster one arm's mean must be after the first half of
/// [`ORDER`] (off-on-on-off, itself balanced against a linear drift) to
/// decide then: a clear difference needs no second half, whose passes of
/// the slower arm would only cost time. Closer means run the whole order.
pub const CLEAR: f64 = 0.05;

/// The last measurement of [`AutoLookahead`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LookaheadChoice {
    /// Whether the lookahead was chosen.
    pub on: bool,
    /// Mean time of a measured pass with and without it.
    pub with: Duration,
    pub without: Duration,
    /// Measurements made so far.
    pub rounds: u32,
}

#[derive(Clone, Copy, Debug)]
enum Phase {
    /// `left` passes of `on` before a measurement.
    Warm {
        on: bool,
        left: u32,
    },
    /// `block` indexes [`ORDER`]; `done` passes of it are measured.
    Measure {
        block: usize,
        done: u32,
        sum: [Duration; 2],
        n: [u32; 2],
    },
    Run {
        on: bool,
        left: u32,
    },
}

/// `auto`'s state: which arm the next pass runs, and the passes measured.
#[derive(Clone, Debug)]
pub struct AutoLookahead {
    phase: Phase,
    choice: Option<LookaheadChoice>,
}

impl Default for AutoLookahead {
    fn default() -> Self {
        Self::new()
    }
}

impl AutoLookahead {
    pub fn new() -> Self {
        AutoLookahead {
            phase: Phase::Warm {
                on: true,
                left: WARMUP,
            },
            choice: None,
        }
    }

    fn measuring() -> Phase {
        Phase::Measure {
            block: 0,
            done: 0,
            sum: [Duration::ZERO; 2],
            n: [0; 2],
        }
    }

    /// Whether the next pass reads ahead.
    pub fn arm(&self) -> bool {
        match self.phase {
            Phase::Measure { block, .. } => ORDER[block],
            Phase::Warm { on, .. } | Phase::Run { on, .. } => on,
        }
    }

    /// A single-token pass that ran `arm` took `took`. A pass whose arm is
    /// no longer the current one (passes that overlapped a switch) is not
    /// counted.
    pub fn record(&mut self, arm: bool, took: Duration) {
        if arm != self.arm() {
            return;
        }
        match &mut self.phase {
            Phase::Warm { left, .. } => {
                *left -= 1;
                if *left == 0 {
                    self.phase = Self::measuring();
                }
            }
            Phase::Measure {
                block,
                done,
                sum,
                n,
            } => {
                sum[arm as usize] += took;
                n[arm as usize] += 1;
                *done += 1;
                if *done < BLOCK {
                    return;
                }
                *done = 0;
                *block += 1;
                let mean = |i: usize| sum[i] / n[i].max(1);
                let (without, with) = (mean(0), mean(1));
                let clear = || {
                    let (a, b) = (with.as_secs_f64(), without.as_secs_f64());
                    a.min(b) < a.max(b) * (1.0 - CLEAR)
                };
                if *block < ORDER.len() && !(*block == ORDER.len() / 2 && clear()) {
                    return;
                }
                let on = with < without;
                let rounds = self.choice.map_or(0, |c| c.rounds) + 1;
                self.choice = Some(LookaheadChoice {
                    on,
                    with,
                    without,
                    rounds,
                });
                self.phase = Phase::Run { on, left: EXPLOIT };
            }
            Phase::Run { on, left } => {
                *left -= 1;
                if *left == 0 {
                    self.phase = Phase::Warm {
                        on: *on,
                        left: WARMUP,
                    };
                }
            }
        }
    }

    /// The last measurement, once one ended.
    pub fn choice(&self) -> Option<LookaheadChoice> {
        self.choice
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEASURED: u32 = BLOCK * ORDER.len() as u32;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// Runs `n` passes, each taking `with` or `without`; returns the arms.
    fn run(a: &mut AutoLookahead, n: u32, with: u64, without: u64) -> Vec<bool> {
        (0..n)
            .map(|_| {
                let arm = a.arm();
                a.record(arm, ms(if arm { with } else { without }));
                arm
            })
            .collect()
    }

    #[test]
    fn measures_both_arms_in_balanced_blocks_then_runs_the_faster() {
        let mut a = AutoLookahead::new();
        // A cold cache's first passes: slow, not counted, with it.
        assert!(run(&mut a, WARMUP, 500, 1000).iter().all(|&on| on));
        assert_eq!(a.choice(), None);
        // 3% apart: not clear after the first half, so the whole order.
        let arms = run(&mut a, MEASURED, 97, 100);
        let expected: Vec<bool> = ORDER
            .iter()
            .flat_map(|&o| std::iter::repeat_n(o, BLOCK as usize))
            .collect();
        assert_eq!(arms, expected);
        assert_eq!(
            a.choice(),
            Some(LookaheadChoice {
                on: true,
                with: ms(97),
                without: ms(100),
                rounds: 1
            })
        );
        assert!(run(&mut a, EXPLOIT, 97, 100).iter().all(|&on| on));
        // Then it measures again, after passes of its choice that are not
        // counted, and a disk that got fast turns it off.
        assert!(run(&mut a, WARMUP, 1000, 1).iter().all(|&on| on));
        let arms = run(&mut a, MEASURED, 103, 100);
        assert_eq!(arms, expected);
        let c = a.choice().unwrap();
        assert!(!c.on && c.rounds == 2, "{c:?}");
        assert!(run(&mut a, EXPLOIT + WARMUP, 103, 100)
            .iter()
            .all(|&on| !on));
        assert_eq!(a.arm(), ORDER[0]);
    }

    #[test]
    fn a_clear_difference_decides_after_the_first_half() {
        let half = MEASURED / 2;
        let expected: Vec<bool> = ORDER[..ORDER.len() / 2]
            .iter()
            .flat_map(|&o| std::iter::repeat_n(o, BLOCK as usize))
            .collect();
        // 10% apart, either way: the first half decides.
        for (with, without, on) in [(90, 100, true), (100, 90, false)] {
            let mut a = AutoLookahead::new();
            run(&mut a, WARMUP, 1, 1);
            assert_eq!(run(&mut a, half, with, without), expected);
            let c = a.choice().expect("decided after the first half");
            assert_eq!((c.on, c.with, c.without), (on, ms(with), ms(without)));
            assert!(run(&mut a, EXPLOIT, with, without)
                .iter()
                .all(|&arm| arm == on));
        }
        // Just inside the margin (5% of the slower mean is 5 ms; 4 ms
        // apart): no choice yet.
        let mut a = AutoLookahead::new();
        run(&mut a, WARMUP, 1, 1);
        run(&mut a, half, 96, 100);
        assert_eq!(a.choice(), None);
        assert_eq!(a.arm(), ORDER[ORDER.len() / 2]);
    }

    #[test]
    fn a_linear_drift_does_not_decide() {
        // Every pass 1 ms slower than the one before, the arms equally fast
        // otherwise: the balanced order gives both the same mean, and a tie
        // keeps the lookahead off.
        let mut a = AutoLookahead::new();
        run(&mut a, WARMUP, 1, 1);
        for i in 0..MEASURED {
            let arm = a.arm();
            a.record(arm, ms(100 + u64::from(i)));
        }
        let c = a.choice().unwrap();
        assert_eq!(c.with, c.without);
        assert!(!c.on);
    }

    #[test]
    fn a_pass_of_another_arm_is_not_counted() {
        let mut a = AutoLookahead::new();
        run(&mut a, WARMUP, 1, 1);
        assert!(!a.arm());
        // A pass that started with the lookahead on ends in an `off` block.
        a.record(true, ms(1));
        let arms = run(&mut a, MEASURED, 100, 90);
        assert_eq!(arms.len() as u32, MEASURED);
        let c = a.choice().unwrap();
        assert_eq!((c.on, c.with, c.without), (false, ms(100), ms(90)));
    }

    #[test]
    fn parses_llama_cpp_style_switch_values() {
        assert_eq!("auto".parse(), Ok(Lookahead::Auto));
        assert_eq!("on".parse(), Ok(Lookahead::On));
        assert_eq!("0".parse(), Ok(Lookahead::Off));
        assert!("sometimes".parse::<Lookahead>().is_err());
    }
}
