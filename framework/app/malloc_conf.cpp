// The process allocator's settings, read by jemalloc when it starts (the
// MALLOC_CONF environment variable still overrides them).
//
// Why jemalloc, and why it keeps what is freed: a training step frees and
// allocates the same large buffers every step: activations, gradient
// buckets, gathered parameters, and the temporaries MPI allocates inside
// its collectives (a reduce-scatter of a 150 MB bucket allocates 150 MB
// more). glibc maps every block above 32 MB fresh from the kernel and
// unmaps it on free, so each step paid the page faults of zeroing that
// memory again: on gpt2-124m at 2 ranks, 250 thousand faults per step
// under zero2 (about 1 GB), a third of its step time. jemalloc reuses freed
// extents of any size; with decay off it never hands them back, as a GPU
// caching allocator keeps its blocks, so a process settles at its
// high-water mark and the faults stop (measured: 85 in 10 s, zero2's step
// from 1.3x ddp's to ddp's). The device's accounting is unchanged: it
// counts what is allocated, not what the allocator keeps.
extern "C" {
// NOLINTNEXTLINE: the name and linkage are jemalloc's interface.
const char* malloc_conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1";
}
