"""involution's backends, one calling convention: each op's function takes the op's own
arguments and then ``out``, the result the op allocated in its fake's layout (``layouts``),
writes it and returns it.

- ``cpu``: the native kernels (``oplib/kernels/involution/csrc/cpu/``, built on first use by
  ``oplib.kernels.native``) or, where they cannot be built or ``OPLIB_CPU_KERNELS=pytorch``,
  the plain-PyTorch strategies (``dense_map``, ``taps``, ``padded``, over ``geometry``);
- ``cuda``: the launches of ``involution.cu`` and ``involution_generated.cu`` under a
  ``LaunchPolicy`` read from the source, through CuPy or the tests' host emulation.

``involution_generated_backward_generator`` takes the same convention with a tuple ``out``
(grad_feature, grad_span_weight, grad_span_bias); on CUDA it has no kernel of its own yet and
composes oplib's ops (``cpu.generator_grads_through_map``, which any device can run).
"""
