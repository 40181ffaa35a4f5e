//! A sampling profile of the host's threads (`nsa bench-decode --cpu-profile`): where a
//! host-bound step's time goes, per thread, down to the function. The GPU machines have no
//! system profiler, so the process samples itself: a sampler thread signals every other thread
//! each `INTERVAL` of wall time (a thread waiting shows where it waits, which tells a busy device
//! thread from a spinning one), and each thread's handler records its id and its stack's
//! addresses into a buffer allocated beforehand; names are resolved after sampling stops.

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Frames kept per sample, innermost first.
const DEPTH: usize = 64;
/// Samples kept; later ones are dropped (and counted).
const CAPACITY: usize = 1 << 17;
/// Wall time between two rounds of samples.
const INTERVAL: Duration = Duration::from_micros(1000);
/// The signal the sampler sends (the process's handler for it is replaced while sampling).
const SIGNAL: libc::c_int = libc::SIGPROF;

#[derive(Clone, Copy)]
struct Sample {
    tid: i32,
    depth: u32,
    ips: [usize; DEPTH],
}

const EMPTY: Sample = Sample { tid: 0, depth: 0, ips: [0; DEPTH] };

/// Where the handler writes: the buffer while sampling, null otherwise.
static BUFFER: AtomicPtr<Sample> = AtomicPtr::new(std::ptr::null_mut());
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Samples the process's threads from [`CpuProfiler::start`] to [`CpuProfiler::stop`]. One at
/// a time: the signal and its handler are the process's.
pub struct CpuProfiler {
    buffer: Box<[Sample]>,
    previous: libc::sigaction,
    running: Arc<AtomicBool>,
    sampler: JoinHandle<()>,
}

impl CpuProfiler {
    pub fn start() -> Result<Self, String> {
        let mut buffer = vec![EMPTY; CAPACITY].into_boxed_slice();
        // The unwinder's first use may allocate: not in a signal handler.
        backtrace::trace(|_| false);
        NEXT.store(0, Ordering::SeqCst);
        BUFFER.store(buffer.as_mut_ptr(), Ordering::SeqCst);
        // SAFETY: installs a handler that only reads the stack and writes the buffer above,
        // which outlives the sampling (`stop` clears the pointer before the buffer drops).
        let previous = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sample as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(SIGNAL, &action, &mut previous) != 0 {
                return Err("cannot install the profiler's signal handler".into());
            }
            previous
        };
        let running = Arc::new(AtomicBool::new(true));
        let flag = running.clone();
        let sampler = std::thread::Builder::new()
            .name("nsa-profiler".into())
            .spawn(move || sample_threads(&flag))
            .map_err(|e| format!("cannot start the profiler's thread: {e}"))?;
        Ok(CpuProfiler { buffer, previous, running, sampler })
    }

    /// Stops sampling; what was sampled, per thread and function.
    pub fn stop(self) -> CpuProfile {
        self.running.store(false, Ordering::SeqCst);
        let _ = self.sampler.join();
        BUFFER.store(std::ptr::null_mut(), Ordering::SeqCst);
        // SAFETY: restores the handler `start` replaced, once no more signals are sent.
        unsafe { libc::sigaction(SIGNAL, &self.previous, std::ptr::null_mut()) };
        let taken = NEXT.load(Ordering::SeqCst);
        let kept = &self.buffer[..taken.min(CAPACITY)];
        CpuProfile::resolve(kept, taken.saturating_sub(CAPACITY))
    }
}

/// The sampler thread: every `INTERVAL`, the signal to each other thread of the process (the
/// list read again every 100 rounds, as threads come and go).
fn sample_threads(running: &AtomicBool) {
    // SAFETY: plain system calls.
    let (pid, me) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid) as i32) };
    let mut threads = Vec::new();
    let mut round = 0usize;
    while running.load(Ordering::SeqCst) {
        if round.is_multiple_of(100) {
            threads = thread_ids().into_iter().filter(|&tid| tid != me).collect();
        }
        for &tid in &threads {
            // SAFETY: a signal whose handler is installed; a thread that has ended fails it.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, SIGNAL) };
        }
        round += 1;
        std::thread::sleep(INTERVAL);
    }
}

fn thread_ids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// The signal handler: the interrupted thread's stack into the next free sample. It takes no
/// lock and allocates nothing (the unwinder reads the stack through its unwind tables).
extern "C" fn on_sample(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut c_void) {
    let buffer = BUFFER.load(Ordering::Acquire);
    if buffer.is_null() {
        return;
    }
    let slot = NEXT.fetch_add(1, Ordering::Relaxed);
    if slot >= CAPACITY {
        return;
    }
    // SAFETY: `slot` is below the buffer's length and no other handler writes it.
    let sample = unsafe { &mut *buffer.add(slot) };
    sample.tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let mut depth = 0;
    // SAFETY: the unsynchronised trace is what a signal handler may call; frames are only read.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            sample.ips[depth] = frame.ip() as usize;
            depth += 1;
            depth < DEPTH
        })
    };
    sample.depth = depth as u32;
}

/// Resolved samples: each thread's name and its stacks, outermost frame first.
pub struct CpuProfile {
    stacks: Vec<(String, Vec<String>)>,
    dropped: usize,
}

impl CpuProfile {
    fn resolve(samples: &[Sample], dropped: usize) -> Self {
        let mut names: HashMap<usize, String> = HashMap::new();
        let mut threads: HashMap<i32, String> = HashMap::new();
        let stacks = samples
            .iter()
            .map(|s| {
                let thread = threads.entry(s.tid).or_insert_with(|| thread_name(s.tid)).clone();
                let frames: Vec<String> = s.ips[..s.depth as usize]
                    .iter()
                    .filter(|&&ip| ip != 0)
                    .map(|&ip| names.entry(ip).or_insert_with(|| symbol(ip)).clone())
                    .collect();
                // The handler's own frames, then the signal trampoline (unnamed in a stripped libc).
                let start = frames.iter().rposition(|f| f.contains("on_sample")).map_or(0, |i| i + 2);
                (thread, frames[start.min(frames.len())..].iter().rev().cloned().collect())
            })
            .collect();
        CpuProfile { stacks, dropped }
    }

    /// This profile's samples and `other`'s.
    pub fn merged(mut self, other: CpuProfile) -> Self {
        self.stacks.extend(other.stacks);
        self.dropped += other.dropped;
        self
    }

    /// Folded stacks (`thread;outer;...;inner count` per line), what flame-graph tools read.
    pub fn folded(&self) -> String {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for (thread, frames) in &self.stacks {
            *counts.entry(format!("{thread};{}", frames.join(";"))).or_default() += 1;
        }
        let mut lines: Vec<_> = counts.into_iter().collect();
        lines.sort_by_key(|l| std::cmp::Reverse(l.1));
        lines.iter().fold(String::new(), |mut out, (stack, n)| {
            let _ = writeln!(out, "{stack} {n}");
            out
        })
    }

    /// Per thread: its samples, the innermost function nearly every sample is inside (within),
    /// then its functions by samples inside them (inclusive, leaving out those nearly every
    /// sample is inside) and by samples at their top (self), `top` of each.
    pub fn summary(&self, top: usize) -> String {
        let mut per_thread: HashMap<&str, Vec<&Vec<String>>> = HashMap::new();
        for (thread, frames) in &self.stacks {
            per_thread.entry(thread).or_default().push(frames);
        }
        let mut threads: Vec<_> = per_thread.into_iter().collect();
        threads.sort_by_key(|t| std::cmp::Reverse(t.1.len()));
        let total = self.stacks.len().max(1);
        let mut out = format!("cpu profile: {} samples ({} dropped)\n", self.stacks.len(), self.dropped);
        for (thread, stacks) in threads {
            let n = stacks.len();
            let _ = writeln!(out, "thread {thread}: {n} samples, {:.1}%", 100.0 * n as f64 / total as f64);
            let mut inclusive: HashMap<&str, usize> = HashMap::new();
            let mut own: HashMap<&str, usize> = HashMap::new();
            for frames in &stacks {
                let mut seen: Vec<&str> = Vec::new();
                for f in frames.iter() {
                    if !seen.contains(&f.as_str()) {
                        seen.push(f);
                        *inclusive.entry(f).or_default() += 1;
                    }
                }
                *own.entry(frames.last().map_or("?", |f| f.as_str())).or_default() += 1;
            }
            // Frames in (nearly) every sample are the thread's entry: only the innermost of them
            // says what the thread does.
            let entry = |f: &&str| inclusive.get(f).is_some_and(|c| c * 100 >= n * 99);
            if let Some(within) = stacks[0].iter().rev().map(String::as_str).find(entry) {
                let _ =
                    writeln!(out, "  {:>9} {:5.1}%  {within}", "within", 100.0 * inclusive[within] as f64 / n as f64);
            }
            inclusive.retain(|_, c| *c * 100 < n * 99);
            for (label, counts) in [("inclusive", inclusive), ("self", own)] {
                let mut counts: Vec<_> = counts.into_iter().collect();
                counts.sort_by_key(|c| std::cmp::Reverse(c.1));
                for (name, c) in counts.into_iter().take(top) {
                    let _ = writeln!(out, "  {label:>9} {:5.1}%  {name}", 100.0 * c as f64 / n as f64);
                }
            }
        }
        out
    }
}

/// The function at `ip`, demangled without its hash; the address where it has no symbol.
fn symbol(ip: usize) -> String {
    let mut name = None;
    // A return address points after its call: look up the byte before it.
    backtrace::resolve(ip.saturating_sub(1) as *mut c_void, |s| {
        if name.is_none() {
            name = s.name().map(|n| format!("{n:#}"));
        }
    });
    name.map_or_else(|| format!("{ip:#x}"), |n| n.replace(';', ","))
}

/// The thread's name and id (threads may share a name).
fn thread_name(tid: i32) -> String {
    let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap_or_default();
    format!("{}/{tid}", name.trim())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::CpuProfiler;

    /// Work the profile must find: not inlined, so that it has a frame of its own.
    #[inline(never)]
    fn spin_for_the_profiler(until: Instant) -> u64 {
        let mut x = 1u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        x
    }

    #[test]
    fn samples_find_the_busy_function_on_its_thread() {
        let profiler = CpuProfiler::start().expect("the profiler starts");
        spin_for_the_profiler(Instant::now() + Duration::from_millis(300));
        let profile = profiler.stop();
        let folded = profile.folded();
        let samples = |frame: &str| -> usize {
            folded
                .lines()
                .filter(|line| line.contains(frame))
                .map(|line| line.rsplit(' ').next().and_then(|n| n.parse::<usize>().ok()).unwrap_or(0))
                .sum()
        };
        let (busy, test) = (samples("spin_for_the_profiler"), samples("samples_find_the_busy_function"));
        // One sample a millisecond of wall time, fewer when a loaded machine delays the sampler:
        // most of this test's samples land in the spin whatever their number.
        assert!(
            busy >= 20 && 2 * busy >= test,
            "{busy} of {test} samples in the busy function; the profile:\n{folded}"
        );
        let summary = profile.summary(5);
        assert!(summary.contains("spin_for_the_profiler"), "the summary names the busy function:\n{summary}");
    }
}
