# sendledger: the `sendledger` binary on a slim Debian. Build: docker build -t sendledger .
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libclang-dev cmake libssl-dev pkg-config && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sendledger && cp target/release/sendledger /usr/local/bin/sendledger

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libstdc++6 zlib1g libssl3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home /var/lib/sendledger --create-home sendledger
COPY --from=build /usr/local/bin/sendledger /usr/local/bin/sendledger
COPY schemas/ /etc/sendledger/
USER sendledger
WORKDIR /var/lib/sendledger
ENTRYPOINT ["sendledger"]
CMD ["run", "--config", "/etc/sendledger/sendledger.example.toml"]
