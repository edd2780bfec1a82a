package main

// Mozilla's root certificates, compiled in. Go uses them only when the
// machine offers no roots of its own, which is the case in muster's image:
// it ships no CA bundle, so the image's bytes do not depend on the build
// machine's bundle and two builds of one commit give one digest. A bundle
// mounted at /etc/ssl/certs or named by SSL_CERT_FILE still wins.
import _ "golang.org/x/crypto/x509roots/fallback"
