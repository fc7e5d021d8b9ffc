"""AWS: the only package that imports boto3 and botocore (tests/check_layers.py).

- `aws.py`: a client of one AWS service with boto3's default credential chain and bounded
  requests, and AWS's errors turned into roq's (one line, an exit code);
- `parameters.py`: the cluster's cluster.json in SSM Parameter Store (`roq keys ssm-put` and
  `ssm-get`), how a host the ec2 provisioner launched gets the cluster's keys.

The ec2 provisioner (roq.gcm.provisioning) builds its EC2 client here too.
"""
