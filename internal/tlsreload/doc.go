// Package tlsreload serves a certificate and key pair from files and
// reloads them when they change, without a restart.
//
// The pair is read at New; a handshake (GetCertificate) then looks at the
// files' modification times and sizes at most once per CheckEvery (1 s)
// and re-reads them when either changed. Stat-polling on the handshake
// path, rather than a file-system watcher, needs no goroutine to start or
// stop and follows the files however they are replaced: written in place,
// renamed over, or swapped by a Kubernetes Secret's symlink.
//
// A new pair that does not load (a key written before its certificate, a
// truncated file) keeps the last good pair in service: the failure is
// logged once per change of the files and counted in
// muster_tls_reload_failures_total, and the pair is tried again when the
// files change again. muster_tls_certificate_expiry_seconds is the
// serving certificate's notAfter, as Unix seconds, for an alert on an
// expiry that no rotation came to prevent. The private key is never
// logged.
//
// ClientCAs is the same for the CA bundle client certificates are
// verified against (mutual TLS): Apply asks clients for a certificate and
// fails the handshake of one that does not verify against the bundle as
// it is at that handshake, while a client without one still connects
// (tls.VerifyClientCertIfGiven, with a bundle that may change). A bundle
// that does not load keeps the last good one, counted in
// muster_tls_client_ca_reload_failures_total.
package tlsreload
