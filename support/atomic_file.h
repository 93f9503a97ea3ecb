// Writes files so that a reader never sees a partial one and a failure leaves the old file:
// write to a temporary beside the target, flush, then rename over it.
#pragma once
#include <string>
#include <string_view>

#include "support/status.h"

namespace memc {

Status write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace memc
