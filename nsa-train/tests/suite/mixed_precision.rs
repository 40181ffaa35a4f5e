//! Mixed precision in the trainer, in a process of its own: Burn keys a device's default float
//! dtype by device type, and `NdArray<f32>` and `NdArray<f64>` share one, so whichever backend
//! touches that device first in a process fixes the default for both. The f64-master run must not
//! depend on what another test touched first.

use crate::common;

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use nsa_train::dashboard::Collect;
use nsa_train::splits::load_splits;
use nsa_train::trainer::Trainer;

#[test]
fn a_narrow_forward_on_wide_master_weights_trains_and_keeps_the_master_dtype() {
    common::in_own_process("mixed_precision::f32_forward_on_f64_master_weights");
}

#[test]
#[ignore = "runs in a process of its own, from a_narrow_forward_on_wide_master_weights_trains_and_keeps_the_master_dtype"]
fn f32_forward_on_f64_master_weights() {
    // bf16-on-f32 as it runs on CUDA, checked one level up on the CPU: f64 master weights and
    // optimiser state, f32 forward.
    type Wide = Autodiff<NdArray<f64>>;
    let dir = common::scratch("mixed");
    let cfg = common::tiny_run(&dir, 30);
    let cfg = cfg.clone().with_train(cfg.train.with_log_every(1).with_checkpoint_every(100));
    let (train, valid, _) = load_splits(&cfg, &[]).unwrap();
    let mut t = Trainer::<Wide>::new(cfg, train, valid, Default::default(), false).unwrap();
    t.replica.compute_dtype = Some(burn::tensor::FloatDType::F32);
    let mut seen = Collect::default();
    t.train_until(30, &mut seen).unwrap();
    let losses: Vec<f64> = seen.steps.iter().map(|m| m.loss).collect();
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(last < first * 0.9, "loss {first} -> {last}");
    struct Dtypes(Vec<burn::tensor::DType>);
    impl<Bk: Backend> ModuleVisitor<Bk> for Dtypes {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Bk, D>>) {
            self.0.push(p.val().dtype());
        }
    }
    let mut dtypes = Dtypes(Vec::new());
    t.replica.model.visit(&mut dtypes);
    assert!(dtypes.0.iter().all(|d| *d == burn::tensor::DType::F64), "{:?}", dtypes.0);
}
