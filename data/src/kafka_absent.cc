// A build without librdkafka (librdkafka-dev): a Kafka source is refused in one line.
#include "ember/common/error.h"
#include "kafka_stream.h"

namespace ember::data {

bool has_kafka() { return false; }

std::unique_ptr<RecordStream> open_kafka_stream(StreamOptions o, std::size_t) {
  throw ConfigError("--stream " + o.source + ": this build reads no Kafka (install librdkafka-dev: scripts/install_deps.sh, then rebuild)");
}

}  // namespace ember::data
