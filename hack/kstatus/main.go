// kstatus-check reads a JSON array of Kubernetes objects on stdin and prints, per object, the status kstatus
// (sigs.k8s.io/cli-utils, what Flux judges health with) computes for it: one line "<name> <status> <message>".
package main

import (
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	var objects []map[string]interface{}
	data, err := io.ReadAll(os.Stdin)
	if err == nil {
		err = json.Unmarshal(data, &objects) // integers stay int64, as kstatus reads them
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus-check: stdin is not a JSON array of objects:", err)
		os.Exit(2)
	}
	for _, object := range objects {
		u := &unstructured.Unstructured{Object: object}
		result, err := status.Compute(u)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kstatus-check:", u.GetName(), err)
			os.Exit(1)
		}
		fmt.Printf("%s %s %s\n", u.GetName(), result.Status, result.Message)
	}
}
