"""involution's plain-PyTorch kernels: the strategies the CPU backend runs where the native
kernels cannot be built or ``OPLIB_CPU_KERNELS=pytorch`` (``dense_map``, ``taps``,
``padded``, over the shared index arithmetic of ``geometry``)."""
