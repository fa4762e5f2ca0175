//! A shard: one task that drives many simulated callers ([`crate::caller::Driver`]) with one
//! timer. Instead of a 20 ms interval per caller, the shard wakes every [`TICK`] (2 ms) and
//! sends the frames of the callers whose 20 ms slot falls on that tick ([`Wheel`], a timing
//! wheel of [`BUCKETS`] buckets): each caller keeps its own exact 20 ms cadence, set by when it
//! joined, and the callers' frames stay spread over the 20 ms instead of leaving in one burst.
//! Agent messages reach the shard on one channel from the callers' socket reader tasks (which
//! timestamp them on arrival); the shard drains what has queued in one wake. A shard that
//! falls behind sends each late caller one frame per pass (like a skipped tick) and counts
//! the lag per caller. It ends when every caller it was given has finished, and returns their
//! results.

use std::ops::RangeInclusive;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::caller::{CallResult, Driver, FRAME, In};
use patterd::util::TaskGuard;

/// How often a shard wakes.
pub const TICK: Duration = Duration::from_millis(2);
/// Ticks per frame: the wheel's buckets.
pub const BUCKETS: u64 = (FRAME.as_nanos() / TICK.as_nanos()) as u64;

/// What a shard is told.
pub enum ShardMsg {
    /// A connected call for `slot`.
    Join(u32, Box<Driver>),
    /// The reader task of `slot`'s socket (it lives as long as the call).
    Reader(u32, TaskGuard),
    /// A message from the server to `slot`.
    In(u32, In),
    /// A call that never connected.
    Failed(Box<CallResult>),
}

/// The shard's schedule: tick `k` falls at `epoch + k · TICK`, and a caller in bucket `b`
/// sends on every tick with `k % BUCKETS == b`, i.e. every 20 ms.
pub struct Wheel {
    epoch: Instant,
    buckets: Vec<Vec<u32>>,
    /// The first tick not yet run.
    next: u64,
}

impl Wheel {
    pub fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            buckets: vec![Vec::new(); BUCKETS as usize],
            next: 0,
        }
    }

    /// When tick `k` is due.
    pub fn at(&self, k: u64) -> Instant {
        self.epoch + TICK * k as u32
    }

    /// The next tick to run.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Schedules `slot` on the least busy bucket, from its first tick at or after `first`
    /// (never a tick already run; at most a frame later than `first`); returns that tick.
    /// Callers that join at a steady rate (5 ms apart at 200 calls/s) would otherwise share a
    /// few buckets and send in bursts.
    pub fn join(&mut self, slot: u32, first: Instant) -> u64 {
        let since = first.saturating_duration_since(self.epoch).as_nanos();
        let k0 = (since.div_ceil(TICK.as_nanos()) as u64).max(self.next);
        let k = (k0..k0 + BUCKETS)
            .min_by_key(|k| (self.buckets[(k % BUCKETS) as usize].len(), *k))
            .unwrap_or(k0);
        self.buckets[(k % BUCKETS) as usize].push(slot);
        k
    }

    /// Unschedules `slot`, which joined at tick `k`.
    pub fn leave(&mut self, slot: u32, k: u64) {
        let b = &mut self.buckets[(k % BUCKETS) as usize];
        if let Some(i) = b.iter().position(|&s| s == slot) {
            b.swap_remove(i);
        }
    }

    /// The callers due on tick `k`.
    pub fn due(&self, k: u64) -> &[u32] {
        &self.buckets[(k % BUCKETS) as usize]
    }

    /// The ticks to run at `now` (at most one round of the wheel: a caller whose tick was
    /// missed by more than a frame sends once, late, instead of catching up); marks them run.
    pub fn advance(&mut self, now: Instant) -> Option<RangeInclusive<u64>> {
        let since = now.saturating_duration_since(self.epoch).as_nanos();
        let k_now = (since / TICK.as_nanos()) as u64;
        if k_now < self.next {
            return None;
        }
        let from = self.next.max(k_now.saturating_sub(BUCKETS - 1));
        self.next = k_now + 1;
        Some(from..=k_now)
    }
}

struct Entry {
    d: Box<Driver>,
    first_k: u64,
}

/// Drives `expected` callers (slots `0..expected`) until each has finished or failed.
pub async fn run(
    mut rx: mpsc::UnboundedReceiver<ShardMsg>,
    expected: usize,
    epoch: Instant,
) -> Vec<CallResult> {
    let mut wheel = Wheel::new(epoch);
    let mut calls: Vec<Option<Entry>> = (0..expected).map(|_| None).collect();
    let mut results = Vec::with_capacity(expected);
    let mut due: Vec<u32> = Vec::new();
    let sleep = tokio::time::sleep_until(wheel.at(0));
    tokio::pin!(sleep);
    let mut open = true;
    while results.len() < expected {
        tokio::select! {
            biased;
            msg = rx.recv(), if open => {
                let Some(mut msg) = msg else {
                    open = false;
                    continue;
                };
                // Everything already queued, in one wake.
                for _ in 0..1024 {
                    handle(msg, &mut calls, &mut wheel, &mut results).await;
                    match rx.try_recv() {
                        Ok(m) => msg = m,
                        Err(_) => break,
                    }
                }
            }
            () = &mut sleep => {
                if let Some(ticks) = wheel.advance(Instant::now()) {
                    for k in ticks {
                        due.clear();
                        due.extend_from_slice(wheel.due(k));
                        let at = wheel.at(k);
                        for &slot in &due {
                            let Some(Some(e)) = calls.get_mut(slot as usize) else {
                                continue;
                            };
                            if k < e.first_k {
                                continue;
                            }
                            if !e.d.on_tick(at).await {
                                finish(slot, &mut calls, &mut wheel, &mut results);
                            }
                        }
                    }
                }
                sleep.as_mut().reset(wheel.at(wheel.next()));
            }
        }
        if !open && calls.iter().all(Option::is_none) {
            break; // nothing more can arrive
        }
    }
    results
}

async fn handle(
    msg: ShardMsg,
    calls: &mut [Option<Entry>],
    wheel: &mut Wheel,
    results: &mut Vec<CallResult>,
) {
    match msg {
        ShardMsg::Join(slot, d) => {
            let first_k = wheel.join(slot, d.t0 + FRAME);
            if let Some(c) = calls.get_mut(slot as usize) {
                *c = Some(Entry { d, first_k });
            }
        }
        ShardMsg::Reader(slot, guard) => {
            if let Some(Some(e)) = calls.get_mut(slot as usize) {
                e.d.reader = Some(guard);
            }
        }
        ShardMsg::In(slot, m) => {
            let Some(Some(e)) = calls.get_mut(slot as usize) else {
                return;
            };
            if !e.d.handle(m).await {
                finish(slot, calls, wheel, results);
            }
        }
        ShardMsg::Failed(r) => results.push(*r),
    }
}

fn finish(
    slot: u32,
    calls: &mut [Option<Entry>],
    wheel: &mut Wheel,
    results: &mut Vec<CallResult>,
) {
    if let Some(e) = calls.get_mut(slot as usize).and_then(Option::take) {
        wheel.leave(slot, e.first_k);
        // Dropping the driver ends its reader task and closes the socket.
        results.push(e.d.res);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the wheel over `ticks` ticks as the shard does, waking at each tick's due time
    /// plus `late(k)`; returns per slot the ticks it was served on (from its first tick on).
    fn serve(
        wheel: &mut Wheel,
        first: &[u64],
        ticks: u64,
        late: impl Fn(u64) -> Duration,
    ) -> Vec<Vec<u64>> {
        let mut served = vec![Vec::new(); first.len()];
        for k in 0..ticks {
            if let Some(run) = wheel.advance(wheel.at(k) + late(k)) {
                for k in run {
                    for &s in wheel.due(k) {
                        if k >= first[s as usize] {
                            served[s as usize].push(k);
                        }
                    }
                }
            }
        }
        served
    }

    #[test]
    fn callers_are_paced_every_20_ms_and_spread_over_the_frame() {
        let epoch = Instant::now();
        let mut w = Wheel::new(epoch);
        // 1000 callers joining 5 ms apart (a 200/s ramp), first frame 20 ms after joining.
        let n = 1000;
        let first: Vec<u64> = (0..n)
            .map(|i| {
                let asked = 5 * u64::from(i) + 20;
                let k = w.join(i, epoch + Duration::from_millis(asked));
                // Not before the asked time, and less than a frame after it.
                assert!(k * 2 >= asked && k * 2 < asked + 20, "{i}: tick {k}");
                k
            })
            .collect();
        let served = serve(&mut w, &first, 3000, |_| Duration::ZERO);
        for (i, ticks) in served.iter().enumerate() {
            assert_eq!(ticks[0], first[i]);
            // Every 20 ms exactly (10 ticks), never twice in one frame, none missed.
            assert!(ticks.windows(2).all(|p| p[1] - p[0] == BUCKETS), "{i}");
            assert_eq!(
                *ticks.last().unwrap_or(&0),
                2999 - (2999 - ticks[0]) % BUCKETS
            );
        }
        // The frames of one 20 ms window are spread evenly over its ten ticks.
        let per_bucket: Vec<usize> = (0..BUCKETS).map(|k| w.due(k).len()).collect();
        assert!(per_bucket.iter().all(|&c| c == 100), "{per_bucket:?}");
    }

    #[test]
    fn a_late_shard_sends_each_caller_once_per_pass() {
        let epoch = Instant::now();
        let mut w = Wheel::new(epoch);
        let first: Vec<u64> = (0..10).map(|i| w.join(i, epoch + TICK * i)).collect();
        assert_eq!(first, (0..10).collect::<Vec<u64>>());
        // The wake for tick 30 comes 50 ms late: ticks 30..=45 are skipped, 46..=55 late.
        let served = serve(&mut w, &first, 100, |k| {
            if k == 30 {
                Duration::from_millis(50)
            } else {
                Duration::ZERO
            }
        });
        for (i, ticks) in served.iter().enumerate() {
            // No caller is served twice in one pass, and all resume their own slot.
            let mut seen = std::collections::HashSet::new();
            assert!(ticks.iter().all(|k| seen.insert(*k)), "{i}: {ticks:?}");
            assert!(
                ticks.iter().all(|k| k % BUCKETS == i as u64),
                "{i}: {ticks:?}"
            );
            assert!(ticks.contains(&(90 + i as u64)), "{i}: {ticks:?}");
        }
    }

    #[test]
    fn join_never_lands_on_a_tick_already_run_and_leave_unschedules() {
        let epoch = Instant::now();
        let mut w = Wheel::new(epoch);
        assert_eq!(w.advance(epoch + Duration::from_millis(9)), Some(0..=4));
        // Asked for a time in the past: scheduled on the next tick to run.
        let k = w.join(7, epoch);
        assert_eq!(k, 5);
        assert_eq!(w.due(15), &[7]);
        w.leave(7, k);
        assert!(w.due(5).is_empty());
        assert_eq!(w.advance(epoch + Duration::from_millis(9)), None);
    }
}
