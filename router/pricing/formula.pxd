# The C signatures of router/pricing/formula.py's terms: the compiled pricing modules
# cimport them (a C call, no Python call), the Python source imports them (router/native.py).
# Counts the column loops read from double columns (chunk size, streams) are doubles here:
# exact below 2**53, and no cast per row (cython.cast is slow when the loops run as Python).

cpdef double queued_prefill_ms(double queue, double base, double per_token, double per_pair, double new,
                               double reused) except? -1
cpdef double prefill_ms(double base, double per_token, double per_pair, long long new, long long reused,
                        double scale) except? -1
cpdef double chunks(long long new, double chunk) except? -1
cpdef double interleaved_ms(double own, long long new, double chunk, double step) except? -1
cpdef double overlap_ms(double live, double planned, double next_start, double prefill,
                        double end) except? -1
cpdef double tpot_ms(double base, double per_token, double context, double queued, double gaps) except? -1
cpdef double handoff_ms(double admission, double moved_blocks, double bytes_per_block,
                        double ms_per_byte) except? -1
cpdef double route_key(double ttft, double tpot, double ttft_ref, double tpot_ref) except? -1
