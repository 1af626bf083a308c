# poolpicker's image for those who build with Docker; `make image` builds the
# same image without a container engine (hack/tools/image), and
# test/install checks that both set the same user, entrypoint, ports and labels.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg COMMIT=$(git rev-parse HEAD) -t ghcr.io/poolpicker/poolpicker:dev .
ARG GO_VERSION=1.26
FROM golang:${GO_VERSION} AS build
ARG VERSION=devel
ARG COMMIT=unknown
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux GOARCH=${TARGETARCH} go build -trimpath \
    -ldflags "-s -w -X github.com/poolpicker/poolpicker/internal/version.Version=${VERSION} -X github.com/poolpicker/poolpicker/internal/version.Commit=${COMMIT}" \
    -o /out/poolpicker ./cmd/poolpicker

# No shell, no libc, no package manager: only the static binary.
FROM scratch
ARG VERSION=devel
ARG COMMIT=unknown
COPY --from=build /out/poolpicker /poolpicker
USER 65532:65532
EXPOSE 9002 9003 9090
LABEL org.opencontainers.image.title="poolpicker" \
      org.opencontainers.image.description="Endpoint Picker for the Gateway API Inference Extension, serving many InferencePools" \
      org.opencontainers.image.source="https://github.com/poolpicker/poolpicker" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
ENTRYPOINT ["/poolpicker"]
