// Package static embeds the admin UI's CSS and its small optional script,
// served from memory so a deploy is one binary.
package static

import "embed"

// FS holds style.css and refresh.js.
//
//go:embed style.css refresh.js
var FS embed.FS
