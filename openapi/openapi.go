// Package openapi embeds muster's OpenAPI description, served at
// /openapi.yaml. A test in server/ keeps it and the router in step.
package openapi

import _ "embed"

// Spec is openapi.yaml.
//
//go:embed openapi.yaml
var Spec []byte
