// Package views holds the templ components of the admin UI (server-rendered,
// usable without JavaScript). The components arrive with the admin UI work;
// `go tool templ generate` output (*_templ.go) is committed and CI checks it
// is fresh.
package views
