// Package static will embed the admin UI's CSS, scripts and icons, served
// from memory so a deploy is one binary.
package static
