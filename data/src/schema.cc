#include "ember/data/schema.h"

#include "ember/common/error.h"

namespace ember::data {

SourceFormat parse_source_format(std::string_view name) {
  if (name == "criteo") return SourceFormat::kCriteoTsv;
  if (name == "criteo-csv") return SourceFormat::kCriteoCsv;
  if (name == "avazu") return SourceFormat::kAvazu;
  throw ConfigError("unknown format '" + std::string(name) + "' (criteo, criteo-csv, avazu)");
}

std::string_view format_name(SourceFormat format) {
  switch (format) {
    case SourceFormat::kCriteoTsv:
      return "criteo";
    case SourceFormat::kCriteoCsv:
      return "criteo-csv";
    case SourceFormat::kAvazu:
      return "avazu";
  }
  return "?";
}

namespace {

Schema make_criteo(SourceFormat f) {
  Schema s{f, {}, {}};
  for (int i = 1; i <= 13; ++i) s.dense_names.push_back("I" + std::to_string(i));
  for (int i = 1; i <= 26; ++i) s.table_names.push_back("C" + std::to_string(i));
  return s;
}

Schema make_avazu() {
  Schema s{SourceFormat::kAvazu, {}, {}};
  s.table_names = {"C1",
                   "banner_pos",
                   "site_id",
                   "site_domain",
                   "site_category",
                   "app_id",
                   "app_domain",
                   "app_category",
                   "device_id",
                   "device_ip",
                   "device_model",
                   "device_type",
                   "device_conn_type",
                   "C14",
                   "C15",
                   "C16",
                   "C17",
                   "C18",
                   "C19",
                   "C20",
                   "C21",
                   "hour",
                   "weekday"};
  return s;
}

}  // namespace

const Schema& schema_for(SourceFormat format) {
  static const Schema criteo_tsv = make_criteo(SourceFormat::kCriteoTsv);
  static const Schema criteo_csv = make_criteo(SourceFormat::kCriteoCsv);
  static const Schema avazu = make_avazu();
  switch (format) {
    case SourceFormat::kCriteoTsv:
      return criteo_tsv;
    case SourceFormat::kCriteoCsv:
      return criteo_csv;
    case SourceFormat::kAvazu:
      return avazu;
  }
  return criteo_tsv;
}

std::string standard_header(SourceFormat format) {
  const Schema& s = schema_for(format);
  std::string h;
  switch (format) {
    case SourceFormat::kCriteoTsv:
      return h;
    case SourceFormat::kCriteoCsv:
      h = "label";
      for (const auto& n : s.dense_names) h += "," + n;
      for (const auto& n : s.table_names) h += "," + n;
      return h;
    case SourceFormat::kAvazu:
      h = "id,click,hour";
      for (std::size_t t = 0; t + 2 < s.table_names.size(); ++t) h += "," + s.table_names[t];  // hour and weekday are derived
      return h;
  }
  return h;
}

}  // namespace ember::data
