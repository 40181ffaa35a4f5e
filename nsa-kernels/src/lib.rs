//! Fused CubeCL kernels for NSA (selected-block and sliding-window attention, forward and
//! backward) as a Burn backend extension. Not written yet: the fused-kernel issue fills this
//! crate; until then every backend runs `nsa-core`'s reference path.
