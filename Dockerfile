# syntax=docker/dockerfile:1
# CAPR's manager image: a static binary on a distroless, non-root base (`make docker-build`).

# The Go version of go.mod's go directive; `make docker-build` passes it from go.mod.
ARG GO_VERSION=1.26.0

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS builder
WORKDIR /workspace
# Modules first: this layer is reused while only CAPR's own sources change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
# Only the packages the manager is built from (.dockerignore keeps everything else out).
COPY main.go ./
COPY api/ api/
COPY controllers/ controllers/
COPY etcdutil/ etcdutil/
COPY remediation/ remediation/
ARG TARGETOS=linux
ARG TARGETARCH
# CGO_ENABLED=0: a static binary, which the distroless static base (no libc) requires.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w" -o /capr .

FROM gcr.io/distroless/static:nonroot
COPY --from=builder /capr /capr
# 65532 is distroless's nonroot user; config/manager runs the container as the same user, with a
# read-only root filesystem (the manager writes no files).
USER 65532:65532
ENTRYPOINT ["/capr"]
