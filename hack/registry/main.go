// Command registry is the OCI registry the real-node tests push to and the node pulls from: distribution's
// registry built from its own Go module with only the filesystem storage driver and htpasswd auth, so the build
// skips the cloud SDKs (Azure, GCS, S3) the full distribution links in.
//
// One command of our own, `registry htpasswd USER` (the password on stdin), prints the bcrypt line htpasswd auth
// reads, so the tests need neither Apache's htpasswd nor a bcrypt package.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	"github.com/spf13/cobra"
	"golang.org/x/crypto/bcrypt"
)

var htpasswdCmd = &cobra.Command{
	Use:   "htpasswd USER",
	Short: "print an htpasswd line (bcrypt) for USER, the password read from stdin",
	Args:  cobra.ExactArgs(1),
	RunE: func(_ *cobra.Command, args []string) error {
		if strings.Contains(args[0], ":") {
			return fmt.Errorf("user name %q must not contain ':'", args[0])
		}
		password, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil && password == "" {
			return fmt.Errorf("reading the password from stdin: %w", err)
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(strings.TrimRight(password, "\r\n")), bcrypt.DefaultCost)
		if err != nil {
			return err
		}
		fmt.Printf("%s:%s\n", args[0], hash)
		return nil
	},
}

func main() {
	registry.RootCmd.AddCommand(htpasswdCmd)
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
