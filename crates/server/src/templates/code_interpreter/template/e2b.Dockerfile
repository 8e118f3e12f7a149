# Warren's built-in code-interpreter template. Its base is the code-interpreter rootfs
# (scripts/setup.d/45-code-interpreter-rootfs.sh: Debian 12 + ipykernel, numpy, pandas, matplotlib, the
# Bash and R kernels and Node.js),
# which the server passes to the builder as this build's Debian base; the steps only add the server.
FROM debian:bookworm
COPY server.py kernel_startup.py javascript_kernel.py javascript_harness.js /opt/warren/interpreter/
# Warren's JavaScript kernel (Node.js from the rootfs behind a Python wrapper kernel), and the same
# kernel for TypeScript (cells transpiled with the rootfs's `typescript` package).
COPY javascript_kernel.json /usr/local/share/jupyter/kernels/javascript/kernel.json
COPY typescript_kernel.json /usr/local/share/jupyter/kernels/typescript/kernel.json
COPY ipython_kernel_config.py /etc/ipython/
ENV MPLBACKEND=module://matplotlib_inline.backend_inline
# ipykernel's debugger warns on every kernel start that Python's frozen modules hide breakpoints.
ENV PYDEVD_DISABLE_FILE_VALIDATION=1
