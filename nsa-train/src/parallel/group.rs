//! Rank 0's side of a data-parallel run and its peers' threads: each peer runs its replica's
//! steps as rank 0 sends them, and reports back. Rank 0 never waits on a peer without a deadline:
//! a peer that fails reports why and the run stops with its rank named; one that does not reach a
//! step's all-reduce within `train.peer_timeout_s` stops the run too.

use std::collections::HashSet;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use burn::collective::{self, CollectiveConfig, CollectiveError, PeerId, ReduceOperation};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use nsa_core::NsaLm;

use super::bucket;
use super::replica::{Gradients, Replica, StepPlan};
use crate::config::TrainConfig;
use crate::data::batch::HostBatch;
use crate::failures::{catch, failure_text, Stop};
use crate::metrics::{DeviceMemory, MemoryOf};
use crate::TrainBackend;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Averages the gradients and loss over every replica (one all-reduce of one flat tensor).
fn all_reduce_mean<B: TrainBackend>(
    rank: usize,
    model: &NsaLm<B>,
    gradients: Gradients<B>,
    wait: impl FnOnce(
        Box<dyn FnOnce() -> Result<FloatTensor<Inner<B>>, CollectiveError> + Send>,
    ) -> Result<FloatTensor<Inner<B>>, Stop>,
) -> Result<Gradients<B>, Stop> {
    let (layout, flat) = bucket::flatten::<B, _>(model, gradients.grads, gradients.loss);
    let primitive = flat.into_primitive().tensor();
    let peer = PeerId(rank as u32);
    let reduced = wait(Box::new(move || collective::all_reduce::<Inner<B>>(peer, primitive, ReduceOperation::Mean)))?;
    let flat = Tensor::from_primitive(TensorPrimitive::Float(reduced));
    let (grads, loss) = bucket::unflatten::<B, _>(model, &layout, flat);
    Ok(Gradients { grads, loss, stats: gradients.stats })
}

/// What rank 0 tells a peer.
enum Order {
    Step { step: usize, batches: Vec<HostBatch>, plan: StepPlan, with_memory: bool },
    Stop,
}

/// What a peer tells rank 0.
enum Report {
    /// About to join the all-reduce of `step`.
    Reached {
        rank: usize,
        step: usize,
    },
    /// Queued all of `step`, with its device's memory when asked.
    Queued {
        rank: usize,
        step: usize,
        memory: Option<DeviceMemory>,
    },
    Failed {
        rank: usize,
        step: usize,
        why: String,
    },
}

/// Rank 0's side of a data-parallel run: its peers and their reports.
pub struct Group {
    world: usize,
    orders: Vec<Sender<Order>>,
    reports: Receiver<Report>,
    threads: Vec<JoinHandle<()>>,
    timeout: Duration,
    /// The device index of each rank, for messages.
    devices: Vec<usize>,
    reached: HashSet<usize>,
    queued: HashSet<usize>,
    /// Each peer's device memory at the last step that asked for it (rank 1 first).
    pub peer_memory: Vec<Option<DeviceMemory>>,
    /// Rank 0 leaves the collective, which is then reset.
    finish: Box<dyn Fn() + Send>,
}

fn collective_config(world: usize) -> CollectiveConfig {
    CollectiveConfig::default().with_num_devices(world)
}

impl Group {
    /// Forks `replica` onto `devices[1..]`, one thread each, and joins them into a collective
    /// with rank 0 (`replica`, on `devices[0]`).
    pub fn start<B: TrainBackend>(
        replica: &Replica<B>,
        devices: &[B::Device],
        t: &TrainConfig,
        memory_of: MemoryOf<B>,
    ) -> Result<Self, Stop> {
        let world = devices.len();
        let (report_tx, reports) = channel();
        let mut orders = Vec::new();
        let mut threads = Vec::new();
        for (rank, device) in devices.iter().enumerate().skip(1) {
            let peer = catch(|| replica.fork(device, rank))
                .map_err(|p| Stop::Error(format!("device {} (rank {rank}): {}", t.devices[rank], failure_text(&p))))?;
            let (order_tx, order_rx) = channel();
            let (t, reports) = (t.clone(), report_tx.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("nsa-rank-{rank}"))
                    .spawn(move || serve(peer, t, order_rx, reports, memory_of))
                    .map_err(|e| Stop::Error(format!("cannot start the thread of rank {rank}: {e}")))?,
            );
            orders.push(order_tx);
        }
        let mut group = Self {
            world,
            orders,
            reports,
            threads,
            timeout: Duration::from_secs(t.peer_timeout_s),
            devices: t.devices.clone(),
            reached: HashSet::new(),
            queued: HashSet::new(),
            peer_memory: vec![None; world - 1],
            // The collective is reset after rank 0 leaves: a peer that failed never left, and
            // the next run in this process must find it empty.
            // burn-collective's calls panic when its server is gone (it died with a device):
            // leaving must not turn a clean error into a panic.
            finish: Box::new(|| {
                let _ = catch(|| {
                    let _ = collective::finish_collective::<Inner<B>>(PeerId(0));
                    collective::reset_collective::<Inner<B>>();
                });
            }),
        };
        let device = devices[0].clone();
        group.wait_for("registration", 0, move || {
            collective::register::<Inner<B>>(PeerId(0), device, collective_config(world))
        })?;
        Ok(group)
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Sends each peer its rows of the step's micro-batches (rank `r` takes rows
    /// `r * per_rank .. (r + 1) * per_rank`); returns rank 0's rows.
    pub(crate) fn send_step(
        &mut self,
        step: usize,
        batches: &[HostBatch],
        plan: &StepPlan,
        with_memory: bool,
    ) -> Result<Vec<HostBatch>, Stop> {
        let per_rank = batches[0].shape[0] / self.world;
        let rows = |rank: usize| batches.iter().map(|b| b.rows(rank * per_rank, (rank + 1) * per_rank)).collect();
        self.reached.clear();
        self.queued.clear();
        for (i, orders) in self.orders.iter().enumerate() {
            let rank = i + 1;
            let order = Order::Step { step, batches: rows(rank), plan: plan.clone(), with_memory };
            if orders.send(order).is_err() {
                return Err(self.stop_for_lost(rank, step));
            }
        }
        Ok(rows(0))
    }

    /// Rank 0's all-reduce of `step`, watched for peer failures and the deadline.
    pub(crate) fn all_reduce_mean<B: TrainBackend>(
        &mut self,
        step: usize,
        model: &NsaLm<B>,
        gradients: Gradients<B>,
    ) -> Result<Gradients<B>, Stop> {
        all_reduce_mean::<B>(0, model, gradients, |reduce| self.wait_for("gradient all-reduce", step, reduce))
    }

    /// Waits until every peer has queued `step`.
    pub(crate) fn collect(&mut self, step: usize) -> Result<(), Stop> {
        let deadline = Instant::now() + self.timeout;
        while self.queued.len() < self.world - 1 {
            match self.reports.recv_timeout(Duration::from_millis(50)) {
                Ok(report) => self.record(report, step)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Err(Stop::Error("every peer thread ended".into())),
            }
            self.check_deadline(deadline, step, "step", &self.queued.clone())?;
        }
        Ok(())
    }

    /// Runs the blocking collective call `call` on a helper thread and waits for it, reading the
    /// peers' reports meanwhile: a peer's failure, or the deadline passing with a peer missing,
    /// ends the wait with an error naming the rank (the helper is left blocked; the run ends).
    fn wait_for<T: Send + 'static>(
        &mut self,
        what: &str,
        step: usize,
        call: impl FnOnce() -> Result<T, CollectiveError> + Send + 'static,
    ) -> Result<T, Stop> {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let _ = tx.send(call());
        });
        let deadline = Instant::now() + self.timeout;
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) => return Err(Stop::Error(format!("data-parallel {what} of step {step} failed: {e:?}"))),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Stop::Error(format!("data-parallel {what} of step {step}: the collective stopped")))
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            while let Ok(report) = self.reports.try_recv() {
                self.record(report, step)?;
            }
            self.check_deadline(deadline, step, what, &self.reached.clone())?;
        }
    }

    /// Notes a peer's report about `step`; a failure becomes the run's error.
    fn record(&mut self, report: Report, step: usize) -> Result<(), Stop> {
        match report {
            Report::Reached { rank, step: s } if s == step => {
                self.reached.insert(rank);
            }
            Report::Queued { rank, step: s, memory } if s == step => {
                self.queued.insert(rank);
                if memory.is_some() {
                    self.peer_memory[rank - 1] = memory;
                }
            }
            Report::Failed { rank, step: s, why } => {
                return Err(Stop::Error(format!(
                    "data-parallel rank {rank} (device {}) failed at step {s}: {why}",
                    self.devices[rank]
                )))
            }
            _ => {}
        }
        Ok(())
    }

    /// An error naming the peers not in `arrived` once `deadline` has passed.
    fn check_deadline(&self, deadline: Instant, step: usize, what: &str, arrived: &HashSet<usize>) -> Result<(), Stop> {
        if Instant::now() < deadline {
            return Ok(());
        }
        let missing: Vec<String> = (1..self.world)
            .filter(|r| !arrived.contains(r))
            .map(|r| format!("rank {r} (device {})", self.devices[r]))
            .collect();
        Err(Stop::Error(format!(
            "data-parallel {what} of step {step}: {} did not arrive within {} s (train.peer_timeout_s); stopped",
            missing.join(", "),
            self.timeout.as_secs()
        )))
    }

    fn stop_for_lost(&self, rank: usize, step: usize) -> Stop {
        Stop::Error(format!("data-parallel rank {rank} (device {}) is gone at step {step}", self.devices[rank]))
    }
}

impl Drop for Group {
    /// Tells the peers to stop and waits a little for them to leave the collective; a peer that
    /// is stuck (after a failure) is left behind, and the collective reset for a later run.
    fn drop(&mut self) {
        for orders in &self.orders {
            let _ = orders.send(Order::Stop);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !self.threads.iter().all(|t| t.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
        }
        for thread in std::mem::take(&mut self.threads) {
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
        (self.finish)();
    }
}

/// A peer's thread: joins the collective, then runs each step it is sent on its replica until
/// told to stop or it fails (reported to rank 0, which stops the run).
fn serve<B: TrainBackend>(
    mut replica: Replica<B>,
    t: TrainConfig,
    orders: Receiver<Order>,
    reports: Sender<Report>,
    memory_of: MemoryOf<B>,
) {
    let rank = replica.rank;
    let _ = reports.send(Report::Reached { rank, step: 0 });
    let peer = PeerId(rank as u32);
    let config = collective_config(t.devices.len());
    let device = replica.device.clone();
    let joined = catch(|| collective::register::<Inner<B>>(peer, device, config).map_err(|e| format!("{e:?}")));
    if let Some(why) = match joined {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(panic) => Some(failure_text(&panic)),
    } {
        let _ = reports.send(Report::Failed { rank, step: 0, why: format!("cannot join the collective: {why}") });
        return;
    }
    let probe = memory_of(&replica.device);
    while let Ok(Order::Step { step, batches, plan, with_memory }) = orders.recv() {
        let queued = catch(|| {
            let gradients = replica.forward_backward(batches, &plan);
            let _ = reports.send(Report::Reached { rank, step });
            let gradients = all_reduce_mean::<B>(rank, &replica.model, gradients, |call| {
                call().map_err(|e| Stop::Error(format!("all-reduce failed: {e:?}")))
            })?;
            Ok::<_, Stop>(replica.apply(&t, plan.lr, gradients))
        });
        let report = match queued {
            Ok(Ok(_)) => Report::Queued { rank, step, memory: with_memory.then(|| probe.as_ref()?()).flatten() },
            Ok(Err(stop)) => Report::Failed { rank, step, why: stop.to_string() },
            Err(panic) => Report::Failed { rank, step, why: failure_text(&panic) },
        };
        let failed = matches!(report, Report::Failed { .. });
        if reports.send(report).is_err() || failed {
            return;
        }
    }
    let _ = catch(|| collective::finish_collective::<Inner<B>>(peer));
}
