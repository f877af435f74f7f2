# recurrl training image. Build, run, GPUs and compose: docs/docker.md.
#
#   docker build -t recurrl .
#   docker run --rm -v "$PWD/runs:/runs" recurrl agent=rdqn env=cartpole_p seed=3
#
# Arguments after the image name are Hydra overrides for `python -m scripts.train`.
FROM debian:bookworm-slim

# The TensorFlow wheel. pyproject.toml pins `tensorflow==2.21.0`; the image installs this instead:
# the CPU-only build by default (smaller), `tensorflow[and-cuda]==2.21.0` for GPU hosts.
ARG TF_PACKAGE=tensorflow-cpu==2.21.0
# Optional dependency groups of pyproject.toml installed too (comma-separated). `ray` (about 250 MB)
# lets `runner=ray` runs start their workers here and makes the image a Ray worker image
# (docs/distributed.md); `--build-arg EXTRAS=` leaves it out.
ARG EXTRAS=ray

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RECURRL_CACHE_DIR=/opt/recurrl-cache \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Debian's Python 3.11, tini and g++, unpinned (DL3008): Debian's archive keeps only the newest
# bookworm version of a package, so a pinned patch version stops installing when the next update
# lands. g++ builds the native ops (agents/native) for the CPU the container runs on.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv tini g++ \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV" \
    && useradd --uid 1000 --user-group --create-home --shell /bin/bash recurrl

WORKDIR /app

# Dependencies first, from pyproject.toml alone, so that a code edit reuses this layer.
# setuptools and wheel are here so that the project itself installs without network below.
COPY pyproject.toml ./
RUN python -c "import os, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extras = [e for e in os.environ['EXTRAS'].split(',') if e]; \
deps = p['dependencies'] + [d for e in extras for d in p['optional-dependencies'][e]]; \
print('\n'.join(d for d in deps if not d.startswith('tensorflow==')))" > /tmp/requirements.txt \
    && pip install "$TF_PACKAGE" -r /tmp/requirements.txt "setuptools==80.9.0" "wheel==0.45.1" \
    && rm /tmp/requirements.txt

# The project. --no-deps keeps the TensorFlow chosen above (pyproject names plain `tensorflow`).
COPY . .
# The native ops are built here for the build host's CPU; a container on another CPU builds its
# own copy (about 40 s) into a temp dir on first use, since /opt/recurrl-cache is read-only to it.
RUN pip install --no-deps --no-build-isolation . \
    && rm -rf build ./*.egg-info \
    && python -m agents.native \
    && chmod -R a+rX "$RECURRL_CACHE_DIR" \
    && mkdir /runs \
    && chown recurrl:recurrl /runs \
    && ln -s /runs runs

# Hydra's default run dirs (runs/<env>-<agent>/<time>, runs/multirun/...) are relative to the
# working directory, so they land in the volume through the `runs` link.
VOLUME ["/runs"]
# TensorBoard, when the image runs `tensorboard --logdir /runs --bind_all` (see compose.yaml).
EXPOSE 6006

# Numeric, so that `runAsNonRoot` checks (Kubernetes) can see it is not root.
USER 1000:1000
# tini as PID 1 passes SIGTERM on (docker stop, compose down), which Python as PID 1 would ignore.
ENTRYPOINT ["tini", "--", "python", "-m", "scripts.train"]
