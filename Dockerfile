# One image, two programs: the manager (/manager, the entrypoint) and the lease agent it
# injects into workload pods (/agent, its own small binary, cmd/agent); and the agent's own
# image (target agent).
FROM golang:1.26 AS builder
ARG TARGETOS
ARG TARGETARCH
WORKDIR /workspace
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/manager
# The agent speaks HTTP/1.1 only: without net/http's HTTP/2 it is half a MiB smaller, resident too.
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} go build -tags nethttpomithttp2 -trimpath -ldflags="-s -w" -o /out/ ./cmd/agent

# The agent alone (docker build --target agent, make docker-build): an image the webhook can
# inject instead of this whole one (--agent-image), so that a node pulls 5 MB for its injected
# pods rather than 28 MB with the manager (docs/operations.md, "The agent's image").
FROM gcr.io/distroless/static:nonroot AS agent
WORKDIR /
COPY --from=builder /out/agent /
USER 65532:65532
ENTRYPOINT ["/agent"]

# The default target, last: the manager, with the agent beside it.
FROM gcr.io/distroless/static:nonroot
WORKDIR /
# /manager runs the operator; the webhook injects /agent into workload pods.
COPY --from=builder /out/manager /out/agent /
USER 65532:65532
ENTRYPOINT ["/manager"]
