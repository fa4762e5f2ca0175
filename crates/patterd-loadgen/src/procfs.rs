//! What the load generator reads about a process from Linux's `/proc`: CPU seconds (user +
//! system, from `/proc/PID/stat`), resident memory now and at its peak (`VmRSS` / `VmHWM` from
//! `/proc/PID/status`), and raising this process's open-file limit (children inherit it).

/// Clock ticks per second for `/proc/PID/stat`.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// User + system CPU seconds used by `pid` (`"self"` works too) so far.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_cpu(&stat)
}

/// User + system CPU seconds used so far by the threads of `pid` whose name starts with
/// `prefix` (from `/proc/PID/task/TID/stat`; threads that already exited are not counted).
pub fn thread_cpu_seconds(pid: &str, prefix: &str) -> Option<f64> {
    let mut total = 0.0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread just exited
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if stat[open + 1..close].starts_with(prefix)
            && let Some(s) = stat_cpu(&stat)
        {
            total += s;
        }
    }
    Some(total)
}

/// utime + stime of one `stat` line, in seconds.
fn stat_cpu(stat: &str) -> Option<f64> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name, state is field 3 of the full line; utime is 14 and stime 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_second())
}

/// Memory of a process, in KiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mem {
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

pub fn mem(pid: &str) -> Option<Mem> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some(Mem {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

/// The machine's 1-minute load average (other work competing for the cores).
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Raises the soft open-file limit to the hard limit; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            let _ = libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        }
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        assert!(cpu_seconds("self").is_some_and(|c| c >= 0.0));
        let m = mem("self").expect("status readable");
        assert!(m.rss_kib > 0 && m.hwm_kib >= m.rss_kib);
    }

    #[test]
    fn thread_cpu_counts_only_named_threads() {
        let spin = std::thread::Builder::new()
            .name("lg-test-spin".into())
            .spawn(|| {
                let t = std::time::Instant::now();
                let mut x = 0u64;
                // Burn CPU until the kernel has charged this thread a clock tick (bounded).
                loop {
                    for _ in 0..1_000_000 {
                        x = x.wrapping_mul(31).wrapping_add(7);
                        std::hint::black_box(x);
                    }
                    let seen = thread_cpu_seconds("self", "lg-test-spin");
                    if seen.is_some_and(|s| s > 0.0) || t.elapsed().as_secs() > 30 {
                        return seen;
                    }
                }
            })
            .expect("spawn");
        let inside = spin.join().expect("join").expect("task stats readable");
        assert!(inside > 0.0, "{inside}");
        assert_eq!(thread_cpu_seconds("self", "no-such-thread"), Some(0.0));
    }
}
