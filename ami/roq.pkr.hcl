# The roq machine image: Debian 12 + Java + ZooKeeper + the roq executable, config and units.
# Valid for Packer 1.6.6 (Debian's package, amazon-ebs built in): no `packer { required_plugins }`
# block, no `packer init`. Build from the repository root after `make dist`:
#
#   packer build -var region=eu-west-1 ami/roq.pkr.hcl
#
# The role (gcm or host) and the cluster addresses are chosen per instance by user data
# (ami/user-data/*.yaml), so one image serves the whole cluster. See docs/deploy.md.
#
# No AWS key is in this template, in the image or in its GCM.properties. Packer takes its own
# credentials from the AWS chain of the machine that runs it (environment, ~/.aws profile, or that
# machine's instance role); the GCM machine launched from the image gets an IAM instance profile
# (ami/iam/, docs/deploy.md), which roq's ec2 provisioner finds through the instance metadata.

variable "region" {
  type    = string
  default = "eu-west-1"
}

variable "instance_type" {
  type    = string
  default = "t3.small"
}

variable "iam_instance_profile" {
  type        = string
  default     = ""
  description = "IAM instance profile of the build instance (empty: none): a role, never keys, for a build that reads from AWS."
}

variable "roq_version" {
  type    = string
  default = "0.1.0"
}

variable "dist_dir" {
  type        = string
  default     = "dist/roq"
  description = "The one-dir executable built by `make dist`."
}

locals {
  # Packer 1.6 has no timestamp() in names that AWS accepts with colons; formatdate is available.
  stamp = formatdate("YYYYMMDD-hhmm", timestamp())
}

source "amazon-ebs" "debian12" {
  region          = var.region
  instance_type   = var.instance_type
  ssh_username    = "admin"
  ami_name        = "roq-${var.roq_version}-debian12-${local.stamp}"
  ami_description = "roq ${var.roq_version}: elastic persistent message queue appliance"
  # The build instance's role, if any (a role, never keys); the image keeps no credential.
  iam_instance_profile = var.iam_instance_profile

  # EBS encrypted (the account's aws/ebs key): the build instance's root volume, and the
  # image's snapshot, so every instance launched from the image has an encrypted root volume.
  # Packer 1.6.6 has no `metadata_options` (IMDSv2 for the build instance) nor `imds_support`
  # (the image's default): IMDSv2 is required where roq launches instances, by the ec2
  # provisioner and in docs/deploy.md's run-instances commands (--metadata-options).
  encrypt_boot = true
  launch_block_device_mappings {
    device_name           = "/dev/xvda"
    volume_size           = 8
    encrypted             = true
    delete_on_termination = true
  }

  source_ami_filter {
    filters = {
      name                = "debian-12-amd64-*"
      architecture        = "x86_64"
      root-device-type    = "ebs"
      virtualization-type = "hvm"
    }
    # Debian's official AWS account.
    owners      = ["136693071363"]
    most_recent = true
  }

  tags = {
    Name    = "roq-${var.roq_version}"
    Project = "roq"
  }
}

build {
  sources = ["source.amazon-ebs.debian12"]

  provisioner "shell" {
    inline = ["mkdir -p /tmp/roq-image"]
  }

  provisioner "file" {
    source      = var.dist_dir
    destination = "/tmp/roq-image/"
  }

  provisioner "file" {
    source      = "config"
    destination = "/tmp/roq-image/"
  }

  provisioner "file" {
    source      = "systemd"
    destination = "/tmp/roq-image/"
  }

  provisioner "file" {
    source      = "ami/files"
    destination = "/tmp/roq-image/"
  }

  provisioner "file" {
    source      = "docs/operations.md"
    destination = "/tmp/roq-image/operations.md"
  }

  provisioner "shell" {
    execute_command  = "sudo -E sh -eu '{{ .Path }}'"
    script           = "ami/install.sh"
    environment_vars = ["ROQ_IMAGE_SRC=/tmp/roq-image"]
  }
}
