#include "ember/data/line_parser.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>

#include "ember/common/error.h"
#include "ember/common/hash.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ember::data {
namespace {

// Splits on a single-byte separator, 16 bytes per step where SSE2 is available:
// Criteo lines have 40 short fields, so per-field memchr calls dominate otherwise.
void split_on(std::string_view line, char sep, std::vector<std::string_view>& out) {
  out.clear();
  const char* p = line.data();
  const char* const end = p + line.size();
  const char* field = p;
#if defined(__SSE2__)
  const __m128i vsep = _mm_set1_epi8(sep);
  for (; end - p >= 16; p += 16) {
    unsigned mask = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), vsep)));
    while (mask != 0) {
      const char* at = p + __builtin_ctz(mask);
      out.emplace_back(field, static_cast<std::size_t>(at - field));
      field = at + 1;
      mask &= mask - 1;
    }
  }
#endif
  for (; p < end; ++p) {
    if (*p == sep) {
      out.emplace_back(field, static_cast<std::size_t>(p - field));
      field = p + 1;
    }
  }
  out.emplace_back(field, static_cast<std::size_t>(end - field));
}

// log(1 + x) for the small non-negative integers that most Criteo dense values are.
struct Log1pTable {
  static constexpr int kSize = 4096;
  float v[kSize];
  Log1pTable() {
    for (int i = 0; i < kSize; ++i) v[i] = static_cast<float>(std::log1p(static_cast<double>(i)));
  }
};
const Log1pTable kLog1p;

float log1p_clamped(double x) {
  if (x <= 0) return 0.0f;
  if (x < Log1pTable::kSize && x == static_cast<double>(static_cast<int>(x))) return kLog1p.v[static_cast<int>(x)];
  return static_cast<float>(std::log1p(x));
}

// 0-15 for hex digits, 0xff otherwise.
struct HexTable {
  std::array<std::uint8_t, 256> v{};
  constexpr HexTable() {
    for (auto& x : v) x = 0xff;
    for (int c = '0'; c <= '9'; ++c) v[c] = static_cast<std::uint8_t>(c - '0');
    for (int c = 'a'; c <= 'f'; ++c) v[c] = static_cast<std::uint8_t>(c - 'a' + 10);
    for (int c = 'A'; c <= 'F'; ++c) v[c] = static_cast<std::uint8_t>(c - 'A' + 10);
  }
};
constexpr HexTable kHex;

bool parse_hex(std::string_view s, std::uint64_t& out) {
  if (s.size() == 8) {
    // Criteo's ids are 8 hex digits: unrolled, one validity test for all eight.
    const auto* u = reinterpret_cast<const unsigned char*>(s.data());
    std::uint32_t d[8];
    std::uint32_t bad = 0;
    for (int i = 0; i < 8; ++i) {
      d[i] = kHex.v[u[i]];
      bad |= d[i];
    }
    if (bad & 0xf0) return false;
    out = (d[0] << 28) | (d[1] << 24) | (d[2] << 20) | (d[3] << 16) | (d[4] << 12) | (d[5] << 8) | (d[6] << 4) | d[7];
    return true;
  }
  if (s.empty() || s.size() > 16) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    std::uint8_t d = kHex.v[static_cast<unsigned char>(c)];
    if (d == 0xff) return false;
    v = (v << 4) | d;
  }
  out = v;
  return true;
}

// Plain decimal integers are the common case in Criteo; from_chars handles the rest.
bool parse_number(std::string_view s, double& out) {
  const char* p = s.data();
  const char* end = p + s.size();
  bool neg = false;
  if (p != end && *p == '-') {
    neg = true;
    ++p;
  }
  if (p != end && end - p <= 15) {
    std::int64_t v = 0;
    const char* q = p;
    while (q != end && static_cast<unsigned>(*q - '0') < 10) v = v * 10 + (*q++ - '0');
    if (q == end) {
      out = static_cast<double>(neg ? -v : v);
      return true;
    }
  }
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && ptr == end && std::isfinite(out);
}

std::string quote(std::string_view s) {
  if (s.size() > 40) return "'" + std::string(s.substr(0, 40)) + "...'";
  return "'" + std::string(s) + "'";
}

// Days since 1970-01-01 of a civil date (proleptic Gregorian).
int days_from_civil(int y, int m, int d) {
  y -= m <= 2;
  const int era = (y >= 0 ? y : y - 399) / 400;
  const int yoe = y - era * 400;
  const int doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

bool equals_ci(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

std::string_view strip_cr(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

}  // namespace

bool split_csv(std::string_view line, std::vector<std::string_view>& fields, std::string& scratch, std::string& error) {
  fields.clear();
  if (line.find('"') == std::string_view::npos) {
    split_on(line, ',', fields);
    return true;
  }
  // Quoted fields: unescape into scratch, reserved up front so views stay valid.
  scratch.clear();
  scratch.reserve(line.size());
  std::size_t i = 0;
  while (true) {
    if (i < line.size() && line[i] == '"') {
      std::size_t begin = scratch.size();
      ++i;
      while (true) {
        if (i >= line.size()) {
          error = "unterminated quoted field " + std::to_string(fields.size() + 1);
          return false;
        }
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            scratch.push_back('"');
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        scratch.push_back(line[i++]);
      }
      fields.emplace_back(scratch.data() + begin, scratch.size() - begin);
      if (i == line.size()) return true;
      if (line[i] != ',') {
        error = "text after closing quote in field " + std::to_string(fields.size());
        return false;
      }
      ++i;
    } else {
      std::size_t comma = line.find(',', i);
      std::string_view f = line.substr(i, comma == std::string_view::npos ? std::string_view::npos : comma - i);
      if (f.find('"') != std::string_view::npos) {
        error = "stray quote in unquoted field " + std::to_string(fields.size() + 1);
        return false;
      }
      fields.push_back(f);
      if (comma == std::string_view::npos) return true;
      i = comma + 1;
    }
  }
}

void LineParser::check_bag_separator(SourceFormat format, char bag) {
  const char sep = format == SourceFormat::kCriteoTsv ? '\t' : ',';
  if (bag == sep || bag == '"' || bag == '\n' || bag == '\r') {
    throw ConfigError(std::string("--multi-hot-sep cannot be ") +
                      (bag == '\t'  ? "a tab"
                       : bag == ',' ? "','"
                                    : "a quote or newline") +
                      " in " + std::string(format_name(format)) + " files");
  }
}

LineParser::LineParser(SourceFormat format, std::string_view first_line, char multi_hot_sep)
    : schema_(&schema_for(format)), format_(format), sep_(format == SourceFormat::kCriteoTsv ? '\t' : ','), bag_sep_(multi_hot_sep) {
  check_bag_separator(format, bag_sep_);
  first_line = strip_cr(first_line);
  if (format == SourceFormat::kCriteoTsv) {
    // label + 13 + 26 = 40 fields; Kaggle test.txt has no label (39).
    std::size_t n = static_cast<std::size_t>(std::count(first_line.begin(), first_line.end(), '\t')) + 1;
    bool labeled = n == 40;
    if (n != 40 && n != 39) {
      throw DataError("expected 40 tab-separated fields (39 without label), found " + std::to_string(n));
    }
    if (labeled) {
      label_col_ = 0;
      columns_.push_back({Role::kLabel, 0});
    }
    for (int i = 0; i < 13; ++i) columns_.push_back({Role::kDense, static_cast<std::uint16_t>(i)});
    for (int i = 0; i < 26; ++i) columns_.push_back({Role::kTable, static_cast<std::uint16_t>(i)});
    return;
  }
  init_header(first_line);
  header_consumed_ = true;
}

void LineParser::init_header(std::string_view header) {
  std::string err;
  if (!split_csv(header, fields_, unquoted_, err)) throw DataError("header: " + err);
  const Schema& s = *schema_;
  std::vector<bool> dense_seen(s.dense_names.size()), table_seen(s.table_names.size());
  bool hour_seen = false;
  if (format_ == SourceFormat::kAvazu) hour_table_ = s.num_tables() - 2;
  for (std::size_t c = 0; c < fields_.size(); ++c) {
    std::string_view name = fields_[c];
    Column col;
    if (equals_ci(name, "id")) {
      col.role = format_ == SourceFormat::kAvazu ? Role::kId : Role::kIgnore;
    } else if (equals_ci(name, format_ == SourceFormat::kAvazu ? "click" : "label")) {
      col.role = Role::kLabel;
      label_col_ = static_cast<int>(c);
    } else if (format_ == SourceFormat::kAvazu && name == "hour") {
      col.role = Role::kHour;
      hour_seen = true;
    } else {
      bool found = false;
      for (std::size_t i = 0; i < s.dense_names.size() && !found; ++i) {
        if (name == s.dense_names[i]) {
          col = {Role::kDense, static_cast<std::uint16_t>(i)};
          dense_seen[i] = found = true;
        }
      }
      // Avazu's `hour` and `weekday` tables are derived, not columns.
      std::size_t raw_tables = format_ == SourceFormat::kAvazu ? s.table_names.size() - 2 : s.table_names.size();
      for (std::size_t i = 0; i < raw_tables && !found; ++i) {
        if (name == s.table_names[i]) {
          col = {Role::kTable, static_cast<std::uint16_t>(i)};
          table_seen[i] = found = true;
        }
      }
      if (!found) {
        if (header.find_first_of("0123456789") == 0 || name.empty()) {
          throw DataError("expected a header line naming the columns, found " + quote(header));
        }
        throw DataError("header: unknown column " + quote(name));
      }
    }
    columns_.push_back(col);
  }
  for (std::size_t i = 0; i < dense_seen.size(); ++i) {
    if (!dense_seen[i]) throw DataError("header: missing column " + s.dense_names[i]);
  }
  std::size_t raw_tables = format_ == SourceFormat::kAvazu ? s.table_names.size() - 2 : s.table_names.size();
  for (std::size_t i = 0; i < raw_tables; ++i) {
    if (!table_seen[i]) throw DataError("header: missing column " + s.table_names[i]);
  }
  if (format_ == SourceFormat::kAvazu && !hour_seen) throw DataError("header: missing column hour");
}

bool LineParser::split(std::string_view line, std::string& error) const {
  if (sep_ == ',') return split_csv(line, fields_, unquoted_, error);
  split_on(line, sep_, fields_);
  return true;
}

bool LineParser::value_key(std::string_view f, std::uint16_t table, std::uint64_t& key, std::string& error) const {
  if (format_ == SourceFormat::kAvazu) {
    std::uint64_t h = hash_bytes(f);
    key = h == kMissingKey ? h - 1 : h;
    return true;
  }
  if (parse_hex(f, key)) return true;
  error = "categorical " + schema_->table_names[table] + " = " + quote(f) + " is not hexadecimal";
  if (const char sep = bag_separator_in(f); bag_sep_ == 0 && sep != 0)
    error += std::string("; a bag of values (ember-data gen --multi-hot writes them)? prep with --multi-hot-sep '") + sep + "'";
  return false;
}

// The one character that splits `f` into hexadecimal values, as a bag's separator
// would (for the error of a bag read as one value); 0 if none does.
char LineParser::bag_separator_in(std::string_view f) {
  const auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); };
  char sep = 0;
  for (char c : f) {
    if (hex(c)) continue;
    if ((sep != 0 && c != sep) || !(std::ispunct(static_cast<unsigned char>(c)) || c == ' ')) return 0;
    sep = c;
  }
  if (sep == 0 || f.front() == sep || f.back() == sep || f.find(std::string(2, sep)) != std::string_view::npos) return 0;
  return sep;
}

bool LineParser::parse(std::string_view line, Record& out, std::string& error, bool dense_values) const {
  line = strip_cr(line);
  if (!split(line, error)) return false;
  if (fields_.size() != columns_.size()) {
    error = "expected " + std::to_string(columns_.size()) + " fields, found " + std::to_string(fields_.size());
    return false;
  }
  const Schema& s = *schema_;
  out.label = 0;
  for (std::size_t c = 0; c < columns_.size(); ++c) {
    std::string_view f = fields_[c];
    const Column col = columns_[c];
    switch (col.role) {
      case Role::kIgnore:
        break;
      case Role::kId: {
        // Avazu ids exceed INT64_MAX: they must at least be valid uint64.
        std::uint64_t id = 0;
        auto [ptr, ec] = std::from_chars(f.data(), f.data() + f.size(), id);
        if (ec != std::errc() || ptr != f.data() + f.size()) {
          error = "id " + quote(f) + " is not an unsigned 64-bit integer";
          return false;
        }
        break;
      }
      case Role::kLabel: {
        double v = 0;
        if (!parse_number(f, v) || (v != 0.0 && v != 1.0)) {
          error = "label " + quote(f) + " is not 0 or 1";
          return false;
        }
        out.label = static_cast<std::uint8_t>(v);
        break;
      }
      case Role::kDense: {
        if (f.empty()) {
          out.dense[col.index] = 0.0f;
          break;
        }
        double v = 0;
        if (!parse_number(f, v)) {
          error = "dense feature " + s.dense_names[col.index] + " = " + quote(f) + " is not a number";
          return false;
        }
        if (dense_values) out.dense[col.index] = log1p_clamped(v);
        break;
      }
      case Role::kTable: {
        if (bag_sep_ != 0) {
          if (!parse_bag(f, col.index, out.bags[col.index], error)) return false;
        } else if (f.empty()) {
          out.keys[col.index] = kMissingKey;
        } else if (!value_key(f, col.index, out.keys[col.index], error)) {
          return false;
        }
        break;
      }
      case Role::kHour:
        if (!parse_hour(f, out, error)) return false;
        break;
    }
  }
  return true;
}

// A multi-hot field: its values split on the bag separator. An empty field is an empty
// bag; "a||b", "|a" and "a|" are malformed.
bool LineParser::parse_bag(std::string_view f, std::uint16_t table, std::vector<std::uint64_t>& bag, std::string& error) const {
  bag.clear();
  for (std::size_t begin = 0; !f.empty();) {
    std::size_t end = std::min(f.find(bag_sep_, begin), f.size());
    std::uint64_t key = 0;
    if (end == begin) {
      error = "categorical " + schema_->table_names[table] + " = " + quote(f) + " has an empty value in its bag (--multi-hot-sep '" +
              std::string(1, bag_sep_) + "')";
      return false;
    }
    if (!value_key(f.substr(begin, end - begin), table, key, error)) return false;
    bag.push_back(key);
    if (end == f.size()) break;
    begin = end + 1;
  }
  return true;
}

// Avazu's hour, YYMMDDHH: the hour of day and the day of week, two tables.
bool LineParser::parse_hour(std::string_view f, Record& out, std::string& error) const {
  int yy = 0, mm = 0, dd = 0, hh = 0;
  bool ok = f.size() == 8 && std::all_of(f.begin(), f.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  if (ok) {
    yy = (f[0] - '0') * 10 + (f[1] - '0');
    mm = (f[2] - '0') * 10 + (f[3] - '0');
    dd = (f[4] - '0') * 10 + (f[5] - '0');
    hh = (f[6] - '0') * 10 + (f[7] - '0');
    ok = mm >= 1 && mm <= 12 && dd >= 1 && dd <= 31 && hh <= 23;
  }
  if (!ok) {
    error = "hour " + quote(f) + " is not YYMMDDHH";
    return false;
  }
  int days = days_from_civil(2000 + yy, mm, dd);
  out.keys[hour_table_] = static_cast<std::uint64_t>(hh);
  out.keys[hour_table_ + 1] = static_cast<std::uint64_t>(((days % 7) + 10) % 7);  // 0 = Monday (1970-01-01 was a Thursday)
  if (bag_sep_ != 0) {
    out.bags[hour_table_].assign(1, out.keys[hour_table_]);
    out.bags[hour_table_ + 1].assign(1, out.keys[hour_table_ + 1]);
  }
  return true;
}

}  // namespace ember::data
