//! The cache of shape-only constants (`nsa_core::constants`): a constant is built once
//! per key, and again for another shape or type.

use nsa_core::constants::cached;
use nsa_tests::B64;

#[test]
fn a_constant_is_built_once_per_key_and_again_for_another_shape() {
    let device = Default::default();
    let mut built = 0;
    for _ in 0..3 {
        let value = cached::<B64, u64>("constants-test", &[7, 9], &device, || {
            built += 1;
            42
        });
        assert_eq!(value, 42);
    }
    assert_eq!(built, 1, "the constant was rebuilt");
    assert_eq!(cached::<B64, u64>("constants-test", &[7, 10], &device, || 5), 5);
    assert_eq!(cached::<B64, u32>("constants-test", &[7, 9], &device, || 6), 6, "types keep apart");
}
