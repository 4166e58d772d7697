// A Kafka topic as a stream (stream.h): kafka://HOST:PORT[,HOST:PORT...]/TOPIC.
//
// The fixed order every worker reads: the topic's partitions (counted when the stream
// starts) take turns, one message each in partition order (partition 0's next message,
// then 1's, ...), each partition by offset; a message holds one or more lines, each a
// record. So a producer spreads its messages evenly over the partitions (round robin),
// or the topic has one partition: a partition that falls behind holds the stream back.
// Every worker consumes the whole topic itself (assigned partitions, no consumer group,
// no offsets committed): the job's checkpoints keep its position.
#pragma once

#include <cstddef>
#include <memory>

#include "ember/data/stream.h"

namespace ember::data {

// ConfigError for a malformed source, a CSV format (only Criteo TSV lines yet), or a
// build without librdkafka.
std::unique_ptr<RecordStream> open_kafka_stream(StreamOptions o, std::size_t batch_size);

}  // namespace ember::data
