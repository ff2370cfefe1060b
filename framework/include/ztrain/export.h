// Symbol visibility for the SDK.
//
// The SDK library (libztrain) is built with hidden visibility by default;
// ZTRAIN_API marks what plugins may call. Interface and exception types are
// BOOST_SYMBOL_VISIBLE so that their type_info is shared across the plugin
// boundary (dynamic_cast and catch by SDK type work in host and plugin alike).
#pragma once

#include <boost/config.hpp>

#define ZTRAIN_API BOOST_SYMBOL_VISIBLE
