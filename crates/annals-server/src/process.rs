//! The process's own series (memory, open files, CPU time, start time), read from Linux's
//! `/proc` at scrape time, as Prometheus' client libraries expose them.

/// What `/proc` says of this process.
#[derive(Debug, Clone)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_memory_bytes: u64,
    pub virtual_memory_bytes: u64,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
    pub start_time_seconds: f64,
}

impl ProcessStats {
    /// The process's figures, or None where `/proc` cannot be read (not Linux).
    pub fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The fields after the command's name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // Counted from the state (field 3 of proc(5)): utime 14, stime 15, starttime 22,
        // vsize 23, rss 24.
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        // SAFETY: sysconf only reads a configuration value.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let (ticks, page) = (u64::try_from(ticks).ok()?, u64::try_from(page).ok()?);
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|limits| {
                limits.lines().find_map(|l| {
                    l.strip_prefix("Max open files")?
                        .split_whitespace()
                        .next()?
                        .parse()
                        .ok()
                })
            });
        Some(ProcessStats {
            cpu_seconds: (field(14)? + field(15)?) as f64 / ticks as f64,
            resident_memory_bytes: field(24)? * page,
            virtual_memory_bytes: field(23)?,
            open_fds,
            max_fds,
            start_time_seconds: boot as f64 + field(22)? as f64 / ticks as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the process's figures are read and plausible on Linux. Method: this test's own
    /// process, against what it knows of itself.
    #[test]
    fn the_process_reads_itself() {
        let Some(p) = ProcessStats::read() else {
            if cfg!(target_os = "linux") {
                panic!("/proc unread on Linux");
            }
            return;
        };
        assert!(p.resident_memory_bytes > 1 << 20, "{p:?}");
        assert!(p.virtual_memory_bytes >= p.resident_memory_bytes, "{p:?}");
        assert!(p.open_fds >= 3, "{p:?}");
        assert!(p.max_fds.is_some_and(|m| m >= p.open_fds), "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(p.start_time_seconds <= now + 1.0 && p.start_time_seconds > now - 86400.0 * 30.0);
        assert!(p.cpu_seconds >= 0.0);
    }
}
