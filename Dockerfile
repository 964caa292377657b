# koord-py: one image for both commands (koord-scheduler, koordlet), for a normal build setup:
#   docker build -t koord-py:0.1.0 .        (or: podman build, buildah bud)
# `make image` builds the same layout without a registry base image (Debian's debootstrap and
# podman, hack/image.sh). Set the image for the manifests in config/kustomization.yaml.
FROM debian:bookworm-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY apis ./apis
COPY scheduler ./scheduler
COPY koordlet ./koordlet
COPY runtimehooks ./runtimehooks
RUN python3 -m pip wheel --no-deps --no-cache-dir -w /wheels . \
 && python3 -m venv /opt/koord-py \
 && /opt/koord-py/bin/pip install --no-cache-dir /wheels/koord_py-*.whl

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && echo 'koord:x:65532:65532:koord-py:/nonexistent:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'koord:x:65532:' >>/etc/group
COPY --from=build /opt/koord-py /opt/koord-py
ENV PATH=/opt/koord-py/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1
LABEL org.opencontainers.image.title=koord-py org.opencontainers.image.licenses=Apache-2.0
# koord-scheduler runs as this user; the koordlet DaemonSet runs privileged (NVML, /dev/nvidia*).
USER 65532:65532
CMD ["koord-scheduler", "--help"]
